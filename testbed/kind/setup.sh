#!/usr/bin/env bash
# Prepares the cluster of the current kubeconfig (a kind cluster, say) for Vigil's test suite:
# kwok with the project's stages, and fake nodes; and, when Docker and kind are there, Vigil's
# image built from the Dockerfile and loaded into the kind cluster as the chart's default image,
# localhost/vigil:<version> (to run the chart in it: helm install vigil charts/vigil -n
# vigil-system --create-namespace). Then: KUBECONFIG=... make test
#   NODES=3 KIND_CLUSTER=vigil IMAGE=localhost/vigil:0.2.0 testbed/kind/setup.sh    (IMAGE= skips the image)
set -euo pipefail
cd "$(dirname "$0")/../.."
NODES=${NODES:-3}
KIND_CLUSTER=${KIND_CLUSTER:-vigil}
IMAGE=${IMAGE-$(testbed/image.sh --print-tags | tail -n 1)}  # the chart's default image

if [[ -n $IMAGE ]]; then
  command -v docker >/dev/null && command -v kind >/dev/null \
    || { echo "setup.sh: docker and kind are needed to build and load $IMAGE (IMAGE= skips it)" >&2; exit 1; }
  docker build -t "$IMAGE" .
  kind load docker-image "$IMAGE" --name "$KIND_CLUSTER"
fi

kubectl apply -f testbed/kind/kwok.yaml
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
