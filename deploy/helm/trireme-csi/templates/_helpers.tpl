{{/* The driver name: fixed by the driver (GetPluginInfo answers it). */}}
{{- define "trireme-csi.driverName" -}}csi.trireme.io{{- end -}}

{{- define "trireme-csi.fullname" -}}
{{- if contains .Chart.Name .Release.Name -}}
{{- .Release.Name | trunc 50 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name .Chart.Name | trunc 50 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}

{{- define "trireme-csi.labels" -}}
app.kubernetes.io/name: trireme-csi
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/part-of: trireme
{{- end -}}

{{- define "trireme-csi.selector" -}}
app.kubernetes.io/name: trireme-csi
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}

{{- define "trireme-csi.tokenSecret" -}}
{{- if .Values.token.existingSecret -}}
{{- .Values.token.existingSecret -}}
{{- else -}}
{{- include "trireme-csi.fullname" . }}-token
{{- end -}}
{{- end -}}

{{/* An image reference; a tag is required (no "latest"). */}}
{{- define "trireme-csi.image" -}}
{{- $tag := required (printf "an image tag is required for %s" .repository) .tag -}}
{{- if eq (toString $tag) "latest" -}}
{{- fail (printf "image %s: pin a release tag, not latest" .repository) -}}
{{- end -}}
{{- printf "%s:%s" .repository (toString $tag) -}}
{{- end -}}

{{/* The REST API addresses, comma-separated as --api takes them. */}}
{{- define "trireme-csi.api" -}}
{{- if not .Values.trireme.api -}}
{{- fail "trireme.api: name at least one trireme node's REST API (http://HOST:7450)" -}}
{{- end -}}
{{- join "," .Values.trireme.api -}}
{{- end -}}

{{/* Where the token Secret is mounted, in the driver's containers. */}}
{{- define "trireme-csi.tokenDir" -}}/etc/trireme-csi/secret{{- end -}}
