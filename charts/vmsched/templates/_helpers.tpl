{{/*
Chart name, truncated to the 63 characters a DNS label allows.
*/}}
{{- define "vmsched.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/*
Fully qualified app name; component suffixes are added to it, so it stops at 52.
*/}}
{{- define "vmsched.fullname" -}}
{{- if .Values.fullnameOverride }}
{{- .Values.fullnameOverride | trunc 52 | trimSuffix "-" }}
{{- else }}
{{- $name := default .Chart.Name .Values.nameOverride }}
{{- if contains $name .Release.Name }}
{{- .Release.Name | trunc 52 | trimSuffix "-" }}
{{- else }}
{{- printf "%s-%s" .Release.Name $name | trunc 52 | trimSuffix "-" }}
{{- end }}
{{- end }}
{{- end }}

{{/*
Chart label value.
*/}}
{{- define "vmsched.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/*
Selector labels of the whole release. Usage: include "vmsched.selectorLabels" .
*/}}
{{- define "vmsched.selectorLabels" -}}
app.kubernetes.io/name: {{ include "vmsched.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end }}

{{/*
Recommended labels of the whole release. Usage: include "vmsched.labels" .
*/}}
{{- define "vmsched.labels" -}}
helm.sh/chart: {{ include "vmsched.chart" . }}
{{ include "vmsched.selectorLabels" . }}
app.kubernetes.io/version: {{ .Values.image.tag | default .Chart.AppVersion | quote }}
app.kubernetes.io/part-of: vmsched
app.kubernetes.io/managed-by: {{ .Release.Service }}
{{- end }}

{{/*
Selector labels of one component. Usage: include "vmsched.componentSelectorLabels" (list . "scoring")
*/}}
{{- define "vmsched.componentSelectorLabels" -}}
{{ include "vmsched.selectorLabels" (index . 0) }}
app.kubernetes.io/component: {{ index . 1 }}
{{- end }}

{{/*
Recommended labels of one component. Usage: include "vmsched.componentLabels" (list . "scoring")
*/}}
{{- define "vmsched.componentLabels" -}}
{{ include "vmsched.labels" (index . 0) }}
app.kubernetes.io/component: {{ index . 1 }}
{{- end }}

{{/*
Name of one component's objects. Usage: include "vmsched.componentName" (list . "scoring")
*/}}
{{- define "vmsched.componentName" -}}
{{- printf "%s-%s" (include "vmsched.fullname" (index . 0)) (index . 1) | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/*
ServiceAccount name.
*/}}
{{- define "vmsched.serviceAccountName" -}}
{{- if .Values.serviceAccount.create }}
{{- default (include "vmsched.fullname" .) .Values.serviceAccount.name }}
{{- else }}
{{- default "default" .Values.serviceAccount.name }}
{{- end }}
{{- end }}

{{/*
Image reference. Usage: include "vmsched.image" (list . .Values.image)
*/}}
{{- define "vmsched.image" -}}
{{- $image := index . 1 }}
{{- printf "%s:%s" $image.repository ($image.tag | default (index . 0).Chart.AppVersion) }}
{{- end }}

{{/*
The bus queues each worker consumes. They are fixed by vmsched/bus/topology.py
(SERVICE_QUEUES); tests/deploy/test_chart.py keeps the two in step.
*/}}
{{- define "vmsched.queues" -}}
discovery: [vmsched.discover.v2]
scoring: [vmsched.filter.v2, vmsched.score.v2]
balancer: [vmsched.balance.v2]
{{- end }}

{{/*
The worker components, in a stable order.
*/}}
{{- define "vmsched.workers" -}}
[discovery, scoring, balancer]
{{- end }}

{{/*
Whether the chart mounts a plugins volume ("true" or "").
*/}}
{{- define "vmsched.plugins.mounted" -}}
{{- with .Values.plugins }}
{{- if or .existingVolume .existingConfigMap .files }}true{{ end }}
{{- end }}
{{- end }}

{{/*
The plugins volume (a list item), when one is configured.
*/}}
{{- define "vmsched.plugins.volume" -}}
{{- with .Values.plugins }}
{{- if .existingVolume }}
- name: plugins
  {{- toYaml .existingVolume | nindent 2 }}
{{- else if .existingConfigMap }}
- name: plugins
  configMap:
    name: {{ .existingConfigMap }}
{{- else if .files }}
- name: plugins
  configMap:
    name: {{ include "vmsched.componentName" (list $ "plugins") }}
{{- end }}
{{- end }}
{{- end }}

{{/*
Whether the shadow candidate runs ("true" or ""): enabled, with a candidate folder.
*/}}
{{- define "vmsched.shadow.enabled" -}}
{{- with .Values.shadow }}
{{- if and .enabled (or .existingVolume .existingConfigMap .files) }}true{{ end }}
{{- end }}
{{- end }}

{{/*
The candidate's volume (a list item), when the shadow runs.
*/}}
{{- define "vmsched.shadow.volume" -}}
{{- if include "vmsched.shadow.enabled" . }}
{{- with .Values.shadow }}
{{- if .existingVolume }}
- name: candidate
  {{- toYaml .existingVolume | nindent 2 }}
{{- else if .existingConfigMap }}
- name: candidate
  configMap:
    name: {{ .existingConfigMap }}
{{- else }}
- name: candidate
  configMap:
    name: {{ include "vmsched.componentName" (list $ "candidate") }}
{{- end }}
{{- end }}
{{- end }}
{{- end }}

{{/*
The candidate's mount (a list item), when the shadow runs.
*/}}
{{- define "vmsched.shadow.mount" -}}
{{- if include "vmsched.shadow.enabled" . }}
- name: candidate
  mountPath: {{ .Values.shadow.mountPath }}
  readOnly: true
{{- end }}
{{- end }}

{{/*
The shadow's command-line arguments (list items), when it runs.
*/}}
{{- define "vmsched.shadow.args" -}}
{{- if include "vmsched.shadow.enabled" . }}
{{- with .Values.shadow }}
- --shadow={{ .mountPath }}
- --shadow-rate={{ .rate }}
- --shadow-queue={{ .queue }}
- --shadow-workers={{ .workers }}
{{- with .factors }}
{{- $items := list }}
{{- range $unit, $factor := . }}
{{- $items = append $items (printf "%s=%d" $unit (int64 $factor)) }}
{{- end }}
- {{ printf "--shadow-factors=%s" (join "," $items) | quote }}
{{- end }}
{{- with .drop }}
- {{ printf "--shadow-drop=%s" (join "," .) | quote }}
{{- end }}
{{- end }}
{{- end }}
{{- end }}

{{/*
Environment of every vmsched container: the file with the component's own broker URL, the log level.
Usage: include "vmsched.env" (list . "scoring")
*/}}
{{- define "vmsched.env" -}}
{{- $root := index . 0 -}}
- name: VMSCHED_AMQP_URL_FILE
  value: {{ printf "%s/url" $root.Values.amqp.mountPath | quote }}
- name: VMSCHED_LOG_LEVEL
  value: {{ $root.Values.logLevel | quote }}
- name: VMSCHED_LOG_FORMAT
  value: {{ $root.Values.logFormat | quote }}
{{- end }}

{{/*
The Secret with one component's broker URL (its own RabbitMQ user). Usage: include "vmsched.amqpSecret" (list . "scoring")
*/}}
{{- define "vmsched.amqpSecret" -}}
{{- $root := index . 0 }}
{{- $name := get $root.Values.amqp.secrets (index . 1) }}
{{- required (printf "amqp.secrets.%s is required: the Secret with that component's broker URL" (index . 1)) $name }}
{{- end }}

{{/*
The volume with one component's broker URL file (a list item). Usage: include "vmsched.amqpVolume" (list . "scoring")
*/}}
{{- define "vmsched.amqpVolume" -}}
{{- $root := index . 0 -}}
- name: amqp
  secret:
    secretName: {{ include "vmsched.amqpSecret" . }}
    # group-readable: the kubelet gives the files to fsGroup, the containers run as its member
    defaultMode: 0440
    items:
      - key: {{ $root.Values.amqp.secretKey }}
        path: url
{{- end }}

{{/*
Name of the Secret holding the gateway's tokens file.
*/}}
{{- define "vmsched.tokensSecret" -}}
{{- .Values.gateway.auth.existingSecret | default (include "vmsched.componentName" (list . "gateway-tokens")) }}
{{- end }}

{{/*
Name of the Secret holding the secret that signs console sessions.
*/}}
{{- define "vmsched.consoleSecret" -}}
{{- .Values.gateway.console.existingSecret | default (include "vmsched.componentName" (list . "gateway-console")) }}
{{- end }}

{{/*
Labels that select the release's pods of some components (for NetworkPolicies).
Usage: include "vmsched.podSelector" (list . (list "gateway" "scoring"))
*/}}
{{- define "vmsched.podSelector" -}}
matchLabels:
  {{- include "vmsched.selectorLabels" (index . 0) | nindent 2 }}
matchExpressions:
  - key: app.kubernetes.io/component
    operator: In
    values: {{ toJson (index . 1) }}
{{- end }}

{{/*
Environment of the plugin-running services: adds the plugin timeout and folder.
*/}}
{{- define "vmsched.serviceEnv" -}}
{{ include "vmsched.env" (list . "") }}
- name: VMSCHED_PLUGIN_TIMEOUT
  value: {{ .Values.pluginTimeout | quote }}
{{- if include "vmsched.plugins.mounted" . }}
- name: VMSCHED_PLUGINS
  value: {{ .Values.plugins.mountPath | quote }}
{{- end }}
{{- end }}

{{/*
Volume mounts shared by the service containers.
*/}}
{{- define "vmsched.volumeMounts" -}}
- name: tmp
  mountPath: /tmp
- name: amqp
  mountPath: {{ .Values.amqp.mountPath }}
  readOnly: true
{{- if include "vmsched.plugins.mounted" . }}
- name: plugins
  mountPath: {{ .Values.plugins.mountPath }}
  readOnly: true
{{- end }}
{{- end }}

{{/*
Volumes of one service pod. Usage: include "vmsched.volumes" (list . "scoring")
*/}}
{{- define "vmsched.volumes" -}}
{{- $root := index . 0 -}}
- name: tmp
  emptyDir:
    sizeLimit: {{ $root.Values.tmpSizeLimit }}
{{- include "vmsched.amqpVolume" . | nindent 0 }}
{{- include "vmsched.plugins.volume" $root }}
{{- end }}

{{/*
Scheduling constraints of one component's pods: its own value, else the chart-wide one.
Usage: include "vmsched.scheduling" (list . .Values.scoring "scoring")
*/}}
{{- define "vmsched.scheduling" -}}
{{- $root := index . 0 }}
{{- $c := index . 1 }}
{{- with ($c.nodeSelector | default $root.Values.nodeSelector) }}
nodeSelector:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with ($c.affinity | default $root.Values.affinity) }}
affinity:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with ($c.tolerations | default $root.Values.tolerations) }}
tolerations:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with $c.topologySpreadConstraints }}
topologySpreadConstraints:
  {{- range . }}
  - {{ toYaml (merge (dict) . (dict "labelSelector" (dict "matchLabels" (include "vmsched.componentSelectorLabels" (list $root (index $ 2)) | fromYaml)))) | nindent 4 | trim }}
  {{- end }}
{{- end }}
{{- with $root.Values.priorityClassName }}
priorityClassName: {{ . }}
{{- end }}
{{- end }}

{{/*
Fail early on contradicting values.
*/}}
{{- define "vmsched.validate" -}}
{{- if and .Values.autoscaling.keda.enabled .Values.autoscaling.hpa.enabled }}
{{- fail "autoscaling.keda.enabled and autoscaling.hpa.enabled are exclusive: KEDA creates its own HPA" }}
{{- end }}
{{- range $c := list "gateway" "discovery" "scoring" "balancer" }}
{{- $_ := include "vmsched.amqpSecret" (list $ $c) }}
{{- end }}
{{- with .Values.shadow }}
{{- if and .enabled (not (or .existingVolume .existingConfigMap .files)) }}
{{- fail "shadow.enabled needs the candidate's plugins folder: set shadow.files, shadow.existingConfigMap or shadow.existingVolume" }}
{{- end }}
{{- end }}
{{- if and .Values.agent.enabled .Values.agent.bus }}
{{- $_ := include "vmsched.amqpSecret" (list $ "agent") }}
{{- end }}
{{- end }}
