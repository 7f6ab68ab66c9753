{{- define "vigil.fullname" -}}
{{- if contains .Chart.Name .Release.Name -}}
{{- .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name .Chart.Name | trunc 63 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}

{{- define "vigil.serviceAccountName" -}}
{{- default (include "vigil.fullname" .) .Values.serviceAccount.name -}}
{{- end -}}

{{- define "vigil.selectorLabels" -}}
app.kubernetes.io/name: {{ .Chart.Name }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}

{{- define "vigil.labels" -}}
{{ include "vigil.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version }}
{{- with .Values.commonLabels }}
{{ toYaml . }}
{{- end }}
{{- end -}}

{{- /*
Checks what values.schema.json cannot: relations between values. Included by deployment.yaml, so
`helm install` and `helm template` stop with a message that says what to change.
*/ -}}
{{- define "vigil.validate" -}}
{{- $v := .Values }}
{{- if and $v.tls.managedByOperator $v.webhook.certManager.enabled }}
{{- fail "tls.managedByOperator and webhook.certManager.enabled both make the webhook's certificate: choose one" }}
{{- end }}
{{- if and (gt (int $v.replicas) 1) (not $v.leaderElection.enabled) }}
{{- fail (printf "replicas=%d needs leaderElection.enabled=true: without leader election every replica would act on the same jobs. Set leaderElection.enabled=true, or replicas=1" (int $v.replicas)) }}
{{- end }}
{{- if $v.leaderElection.enabled }}
{{- $lease := float64 $v.leaderElection.leaseDurationSeconds }}
{{- $renew := float64 $v.leaderElection.renewDeadlineSeconds }}
{{- $retry := float64 $v.leaderElection.retryPeriodSeconds }}
{{- if le $lease $renew }}
{{- fail (printf "leaderElection.leaseDurationSeconds (%v) must be greater than leaderElection.renewDeadlineSeconds (%v): a leader that cannot renew must stop acting before its lease can expire at the standbys" $v.leaderElection.leaseDurationSeconds $v.leaderElection.renewDeadlineSeconds) }}
{{- end }}
{{- if le $renew (mulf 1.2 $retry) }}
{{- fail (printf "leaderElection.renewDeadlineSeconds (%v) must be greater than 1.2 x leaderElection.retryPeriodSeconds (%v): the leader needs room for more than one attempt to renew" $v.leaderElection.renewDeadlineSeconds $v.leaderElection.retryPeriodSeconds) }}
{{- end }}
{{- end }}
{{- $ports := dict (toString $v.operator.healthPort) "operator.healthPort" }}
{{- if $v.metrics.enabled }}
{{- if hasKey $ports (toString $v.metrics.port) }}
{{- fail (printf "metrics.port (%v) is already taken by %s: give each a port of its own" $v.metrics.port (get $ports (toString $v.metrics.port))) }}
{{- end }}
{{- $_ := set $ports (toString $v.metrics.port) "metrics.port" }}
{{- end }}
{{- if $v.webhook.enabled }}
{{- if hasKey $ports (toString $v.webhook.port) }}
{{- fail (printf "webhook.port (%v) is already taken by %s: give each a port of its own" $v.webhook.port (get $ports (toString $v.webhook.port))) }}
{{- end }}
{{- $_ := set $ports (toString $v.webhook.port) "webhook.port" }}
{{- end }}
{{- if and (include "vigil.beats" .) (hasKey $ports (toString $v.heartbeat.port)) }}
{{- fail (printf "heartbeat.port (%v) is already taken by %s: give each a port of its own (the beats have a server of their own)" $v.heartbeat.port (get $ports (toString $v.heartbeat.port))) }}
{{- end }}
{{- if and $v.heartbeat.namespaces (not (and $v.heartbeat.policy.create $v.heartbeat.serviceAccountNames)) }}
{{- fail "heartbeat.namespaces grants the job accounts patch on every pod of those namespaces, which only the heartbeat policy narrows to their own pod's heartbeat: keep heartbeat.policy.create=true (and heartbeat.serviceAccountNames), or set heartbeat.namespaces=[]" }}
{{- end }}
{{- if and $v.metrics.serviceMonitor.enabled (not $v.metrics.enabled) }}
{{- fail "metrics.serviceMonitor.enabled=true needs metrics.enabled=true (there is nothing to scrape otherwise)" }}
{{- end }}
{{- end -}}

{{- /* The webhook's Service, in front of the webhook's port and (with beats to the leader) the beat port. */ -}}
{{- define "vigil.webhookService" -}}
{{- printf "%s-webhook" (include "vigil.fullname" .) | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{- /*
"true" when the operator serves beats to the leader (docs/heartbeats.md): heartbeat.leaderChannel
with the webhook on, whose certificate Secret and Service (which selects the leader's pod alone)
the beat server reuses, on a port of its own (heartbeat.port).
*/ -}}
{{- define "vigil.beats" -}}
{{- if and .Values.heartbeat.leaderChannel .Values.webhook.enabled }}true{{ end }}
{{- end -}}

{{- /* The beat port of the webhook's Service: the port in the URL the pods are given. */ -}}
{{- define "vigil.beatServicePort" -}}8443{{- end -}}

{{- /*
"true" when operator.watchNamespaces lists namespaces and none is a glob pattern: the operator then
watches each one alone, so every grant can be a Role in that namespace. A glob means watching all
namespaces (RBAC has no patterns: a Role needs a namespace's name), so the grants stay cluster-wide.
*/ -}}
{{- define "vigil.namespacedRbac" -}}
{{- $literal := gt (len .Values.operator.watchNamespaces) 0 }}
{{- range .Values.operator.watchNamespaces }}
{{- if regexMatch "[*?\\[]" . }}{{ $literal = false }}{{ end }}
{{- end }}
{{- if $literal }}true{{ end }}
{{- end -}}

{{- /* The operator's rules on jobs, queues, pods and events: a ClusterRole's, or each watched namespace's Role's. */ -}}
{{- define "vigil.operatorRules" -}}
# Jobs: listed and watched; read directly before releasing the pods of a job that may be
# gone; labelled vigil.dev/dead-letter; deleted after ttlSecondsAfterFinished.
- apiGroups: ["vigil.dev"]
  resources: ["vigiljobs"]
  verbs: ["get", "list", "watch", "patch", "delete"]
# Status is Vigil's memory, written only through the subresource (merge patches fenced by
# resourceVersion).
- apiGroups: ["vigil.dev"]
  resources: ["vigiljobs/status"]
  verbs: ["patch"]
# A pod's owner reference to its job sets blockOwnerDeletion; the
# OwnerReferencesPermissionEnforcement admission plugin (on in some distributions) allows that
# only to who may update the owner's finalizers: without this rule every pod create is a 403.
- apiGroups: ["vigil.dev"]
  resources: ["vigiljobs/finalizers"]
  verbs: ["update"]
# Queues: listed and watched (their limits); their status (depth, running, conditions) is
# written by Vigil in batches through the subresource.
- apiGroups: ["vigil.dev"]
  resources: ["vigilqueues"]
  verbs: ["get", "list", "watch"]
- apiGroups: ["vigil.dev"]
  resources: ["vigilqueues/status"]
  verbs: ["patch"]
# Worker pools: listed and watched (their template, bounds and scale); their status (replicas,
# the backlog, conditions: the /scale subresource reads status.replicas and status.selector) is
# written through the subresource, merge patches fenced by resourceVersion. Their worker pods
# carry the pool as owner with blockOwnerDeletion, hence the finalizers' update, as for jobs.
- apiGroups: ["vigil.dev"]
  resources: ["vigilworkerpools"]
  verbs: ["get", "list", "watch"]
- apiGroups: ["vigil.dev"]
  resources: ["vigilworkerpools/status"]
  verbs: ["patch"]
- apiGroups: ["vigil.dev"]
  resources: ["vigilworkerpools/finalizers"]
  verbs: ["update"]
# One pod per attempt: created; listed, watched and read directly before anything destructive;
# patched to mark a Lost attempt superseded and to remove the vigil.dev/attempt-tracking
# finalizer once its outcome is recorded; deleted on Lost, deadlines and suspend.
# A pool's worker pods: created, listed and watched; deleted when idle and no longer wanted, or ended.
- apiGroups: [""]
  resources: ["pods"]
  verbs: ["get", "list", "watch", "create", "patch", "delete"]
# An Event for every transition of a job: created, and patched (its count) when it repeats,
# as client-go's event correlator does.
- apiGroups: [""]
  resources: ["events"]
  verbs: ["create", "patch"]
{{- end -}}

{{- /* What secure metrics need: who a scraper's token names, and whether it may get /metrics. */ -}}
{{- define "vigil.metricsAuthRules" -}}
{{- if and .Values.metrics.enabled .Values.metrics.secure }}
# /metrics asks the API server who a scraper's token names and whether it may get /metrics.
- apiGroups: ["authentication.k8s.io"]
  resources: ["tokenreviews"]
  verbs: ["create"]
- apiGroups: ["authorization.k8s.io"]
  resources: ["subjectaccessreviews"]
  verbs: ["create"]
{{- end }}
{{- end -}}
