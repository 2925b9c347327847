{{/*
Host facts on the gateway, scoring and balancer (docs/facts.md): the explicit host map (a ConfigMap) and the
optional, read-only engine link (a Secret with its file, the engine's CA from a ConfigMap).
*/}}

{{- define "vmsched.facts.hostMapName" -}}
{{- .Values.facts.existingHostMapConfigMap | default (include "vmsched.componentName" (list . "host-map")) }}
{{- end }}

{{- define "vmsched.facts.hasHostMap" -}}
{{- if or .Values.facts.hostMap .Values.facts.existingHostMapConfigMap }}true{{ end }}
{{- end }}

{{- define "vmsched.facts.linkSecret" -}}
{{- .Values.facts.engineLink.existingSecret | default (include "vmsched.componentName" (list . "engine-link")) }}
{{- end }}

{{/*
Environment of a facts reader (env list items).
*/}}
{{- define "vmsched.facts.env" -}}
{{- $f := .Values.facts }}
{{- if include "vmsched.facts.hasHostMap" . }}
- name: VMSCHED_FACTS_HOST_MAP
  value: {{ printf "%s/%s" $f.hostMapMountPath $f.hostMapKey | quote }}
{{- end }}
{{- if $f.engineLink.enabled }}
- name: VMSCHED_ENGINE_LINK_FILE
  value: {{ printf "%s/%s" $f.engineLink.mountPath $f.engineLink.secretKey | quote }}
- name: VMSCHED_ENGINE_LINK_TIMEOUT
  value: {{ $f.engineLink.timeout | quote }}
- name: VMSCHED_ENGINE_LINK_TTL
  value: {{ $f.engineLink.ttl | quote }}
{{- if $f.engineLink.caConfigMap }}
- name: VMSCHED_ENGINE_LINK_CA
  value: {{ printf "%s/%s" $f.engineLink.caMountPath $f.engineLink.caKey | quote }}
{{- end }}
{{- end }}
{{- end }}

{{/*
Volume mounts of a facts reader (list items; empty without a host map or link).
*/}}
{{- define "vmsched.facts.mounts" -}}
{{- $f := .Values.facts }}
{{- if include "vmsched.facts.hasHostMap" . }}
- name: host-map
  mountPath: {{ $f.hostMapMountPath }}
  readOnly: true
{{- end }}
{{- if $f.engineLink.enabled }}
- name: engine-link
  mountPath: {{ $f.engineLink.mountPath }}
  readOnly: true
{{- if $f.engineLink.caConfigMap }}
- name: engine-ca
  mountPath: {{ $f.engineLink.caMountPath }}
  readOnly: true
{{- end }}
{{- end }}
{{- end }}

{{/*
Volumes of a facts reader (list items).
*/}}
{{- define "vmsched.facts.volumes" -}}
{{- $f := .Values.facts }}
{{- if include "vmsched.facts.hasHostMap" . }}
- name: host-map
  configMap:
    name: {{ include "vmsched.facts.hostMapName" . }}
    items:
      - key: {{ $f.hostMapKey }}
        path: {{ $f.hostMapKey }}
{{- end }}
{{- if $f.engineLink.enabled }}
- name: engine-link
  secret:
    secretName: {{ include "vmsched.facts.linkSecret" . }}
    # group-readable: the kubelet gives the files to fsGroup, the containers run as its member
    defaultMode: 0440
    items:
      - key: {{ $f.engineLink.secretKey }}
        path: {{ $f.engineLink.secretKey }}
{{- if $f.engineLink.caConfigMap }}
- name: engine-ca
  configMap:
    name: {{ $f.engineLink.caConfigMap }}
    items:
      - key: {{ $f.engineLink.caKey }}
        path: {{ $f.engineLink.caKey }}
{{- end }}
{{- end }}
{{- end }}
