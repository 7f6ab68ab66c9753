#!/usr/bin/env bash
# Prepares the cluster of the current kubeconfig (a kind cluster, say) for Vigil's test suite:
# kwok with the project's stages, and fake nodes. Then: KUBECONFIG=... make test
set -euo pipefail
cd "$(dirname "$0")/../.."
NODES=${NODES:-3}

kubectl apply -f e2e/kind/kwok.yaml
kubectl -n vigil-kwok create configmap kwok-stages --from-file=stages.yaml=testbed/kwok-stages.yaml \
  --dry-run=client -o yaml | kubectl apply -f -
kubectl -n vigil-kwok rollout restart deployment/kwok
kubectl -n vigil-kwok rollout status deployment/kwok --timeout=180s
python3 -c "
import json, sys
sys.path.insert(0, '.')
from testbed.cluster import fake_node
print(json.dumps({'apiVersion': 'v1', 'kind': 'List', 'items': [fake_node(f'kwok-node-{i}') for i in range($NODES)]}))
" | kubectl apply -f -
kubectl wait --for=condition=Ready node -l type=kwok --timeout=120s
kubectl get nodes
