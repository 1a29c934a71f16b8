{{/*
Names are fixed (a contract with the RBAC tests and the docs), so install one release of this
chart per cluster.
*/}}

{{/* Labels of every object of a component: include "kkp-quota.labels" (list $ "seed-controller") */}}
{{- define "kkp-quota.labels" -}}
{{- $root := index . 0 -}}
app.kubernetes.io/name: kkp-quota
app.kubernetes.io/instance: {{ $root.Release.Name }}
app.kubernetes.io/component: {{ index . 1 }}
app.kubernetes.io/version: {{ $root.Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ $root.Release.Service }}
helm.sh/chart: {{ printf "%s-%s" $root.Chart.Name $root.Chart.Version }}
{{- end -}}

{{/* The labels a component's pods are selected by (immutable in a Deployment's selector). */}}
{{- define "kkp-quota.selectorLabels" -}}
app.kubernetes.io/name: kkp-quota
app.kubernetes.io/component: {{ . }}
{{- end -}}

{{/* The image of a component: include "kkp-quota.image" (list $ .Values.seedController) */}}
{{- define "kkp-quota.image" -}}
{{- $root := index . 0 -}}
{{- $component := index . 1 -}}
{{- $tag := $root.Values.image.tag | default $root.Chart.AppVersion -}}
{{- with $root.Values.image.registry -}}
{{ trimSuffix "/" . }}/{{ $component.image.repository }}:{{ $tag }}
{{- else -}}
{{ $component.image.repository }}:{{ $tag }}
{{- end -}}
{{- end -}}

{{/* The webhook Service's DNS names (the serving certificate must be valid for them). */}}
{{- define "kkp-quota.webhookDnsNames" -}}
{{- $svc := printf "kkp-quota-machine-webhook.%s.svc" .Release.Namespace -}}
{{- $names := list $svc (printf "%s.%s" $svc .Values.clusterDomain) -}}
{{- with .Values.seedController.webhookUrl -}}
{{- $host := (urlParse .).hostname -}}
{{- if not (has $host $names) }}{{ $names = append $names $host }}{{ end -}}
{{- end -}}
{{- join "," $names -}}
{{- end -}}

{{/* The base URL seed-controller writes into every user cluster's webhook configuration. */}}
{{- define "kkp-quota.webhookUrl" -}}
{{- .Values.seedController.webhookUrl | default (printf "https://kkp-quota-machine-webhook.%s.svc:443" .Release.Namespace) -}}
{{- end -}}

{{/* Restricted pod security (Pod Security Standard "restricted"). */}}
{{- define "kkp-quota.podSecurityContext" -}}
runAsNonRoot: true
runAsUser: 65532
runAsGroup: 65532
fsGroup: 65532
seccompProfile:
  type: RuntimeDefault
{{- end -}}

{{- define "kkp-quota.containerSecurityContext" -}}
runAsNonRoot: true
runAsUser: 65532
runAsGroup: 65532
readOnlyRootFilesystem: true
allowPrivilegeEscalation: false
capabilities:
  drop: ["ALL"]
seccompProfile:
  type: RuntimeDefault
{{- end -}}

{{/* POD_NAME: leader identity and Event reporting instance. */}}
{{- define "kkp-quota.podNameEnv" -}}
- name: POD_NAME
  valueFrom:
    fieldRef:
      fieldPath: metadata.name
{{- end -}}

{{/*
Scheduling and metadata of a component's pods: include "kkp-quota.podScheduling" (list $ .Values.x "component")
Without an affinity of the user's, replicas prefer different nodes.
*/}}
{{- define "kkp-quota.podScheduling" -}}
{{- $root := index . 0 -}}
{{- $c := index . 1 -}}
{{- $name := index . 2 -}}
{{- with $root.Values.imagePullSecrets }}
imagePullSecrets:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with $c.priorityClassName }}
priorityClassName: {{ . }}
{{- end }}
{{- with $c.nodeSelector }}
nodeSelector:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with $c.tolerations }}
tolerations:
  {{- toYaml . | nindent 2 }}
{{- end }}
affinity:
{{- if $c.affinity }}
  {{- toYaml $c.affinity | nindent 2 }}
{{- else }}
  podAntiAffinity:
    preferredDuringSchedulingIgnoredDuringExecution:
      - weight: 100
        podAffinityTerm:
          topologyKey: kubernetes.io/hostname
          labelSelector:
            matchLabels:
              {{- include "kkp-quota.selectorLabels" $name | nindent 14 }}
{{- end }}
{{- end -}}

{{/* Liveness and readiness on the metrics port: include "kkp-quota.probes" "/readyz" */}}
{{- define "kkp-quota.probes" -}}
livenessProbe:
  httpGet:
    path: /healthz
    port: metrics
  initialDelaySeconds: 5
  periodSeconds: 10
  timeoutSeconds: 3
  failureThreshold: 3
readinessProbe:
  httpGet:
    path: {{ . }}
    port: metrics
  periodSeconds: 5
  timeoutSeconds: 3
  failureThreshold: 3
{{- end -}}

{{/* A PodDisruptionBudget: include "kkp-quota.pdb" (list $ .Values.x "component") */}}
{{- define "kkp-quota.pdb" -}}
{{- $root := index . 0 -}}
{{- $c := index . 1 -}}
{{- $name := index . 2 -}}
{{- if $c.pdb.enabled }}
---
apiVersion: policy/v1
kind: PodDisruptionBudget
metadata:
  name: kkp-quota-{{ $name }}
  namespace: {{ $root.Release.Namespace }}
  labels:
    {{- include "kkp-quota.labels" (list $root $name) | nindent 4 }}
spec:
  minAvailable: {{ $c.pdb.minAvailable }}
  selector:
    matchLabels:
      {{- include "kkp-quota.selectorLabels" $name | nindent 6 }}
{{- end }}
{{- end -}}

{{/* The Service Prometheus scrapes: include "kkp-quota.metricsService" (list $ .Values.x "component") */}}
{{- define "kkp-quota.metricsService" -}}
{{- $root := index . 0 -}}
{{- $c := index . 1 -}}
{{- $name := index . 2 }}
---
apiVersion: v1
kind: Service
metadata:
  name: kkp-quota-{{ $name }}-metrics
  namespace: {{ $root.Release.Namespace }}
  labels:
    {{- include "kkp-quota.labels" (list $root $name) | nindent 4 }}
    kkp-quota.dev/metrics: {{ $root.Values.role | quote }}
spec:
  type: ClusterIP
  selector:
    {{- include "kkp-quota.selectorLabels" $name | nindent 4 }}
  ports:
    - name: metrics
      port: {{ int64 $c.metricsPort }}
      targetPort: metrics
      protocol: TCP
{{- end -}}

{{/*
One Role and RoleBinding per namespace for a component's namespaced rules:
include "kkp-quota.namespacedRbac" (dict "root" $ "component" "seed-controller" "serviceAccount" "kkp-quota-seed-controller" "rules" (dict "<namespace>" "<rules YAML>"))
Rules for the same namespace are gathered into one Role (names are fixed, so two Roles of one
component in one namespace would collide).
*/}}
{{- define "kkp-quota.namespacedRbac" -}}
{{- $root := .root -}}
{{- range $namespace := keys .rules | sortAlpha }}
---
apiVersion: rbac.authorization.k8s.io/v1
kind: Role
metadata:
  name: kkp-quota-{{ $.component }}
  namespace: {{ $namespace }}
  labels:
    {{- include "kkp-quota.labels" (list $root $.component) | nindent 4 }}
rules:
{{- index $.rules $namespace }}
---
apiVersion: rbac.authorization.k8s.io/v1
kind: RoleBinding
metadata:
  name: kkp-quota-{{ $.component }}
  namespace: {{ $namespace }}
  labels:
    {{- include "kkp-quota.labels" (list $root $.component) | nindent 4 }}
roleRef:
  apiGroup: rbac.authorization.k8s.io
  kind: Role
  name: kkp-quota-{{ $.component }}
subjects:
  - kind: ServiceAccount
    name: {{ $.serviceAccount }}
    namespace: {{ $root.Release.Namespace }}
{{- end }}
{{- end -}}

{{/* A ServiceAccount: include "kkp-quota.serviceAccount" (list $ "component" "name") */}}
{{- define "kkp-quota.serviceAccount" -}}
{{- $root := index . 0 }}
---
apiVersion: v1
kind: ServiceAccount
metadata:
  name: {{ index . 2 }}
  namespace: {{ $root.Release.Namespace }}
  labels:
    {{- include "kkp-quota.labels" (list $root (index . 1)) | nindent 4 }}
{{- end -}}

{{/* A ClusterRoleBinding of ClusterRole and ServiceAccount of the same name. */}}
{{- define "kkp-quota.clusterRoleBinding" -}}
{{- $root := index . 0 }}
---
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRoleBinding
metadata:
  name: {{ index . 2 }}
  labels:
    {{- include "kkp-quota.labels" (list $root (index . 1)) | nindent 4 }}
roleRef:
  apiGroup: rbac.authorization.k8s.io
  kind: ClusterRole
  name: {{ index . 2 }}
subjects:
  - kind: ServiceAccount
    name: {{ index . 2 }}
    namespace: {{ $root.Release.Namespace }}
{{- end -}}
