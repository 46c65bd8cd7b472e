{{/* The pathmend image: repository and tag (default: the chart's appVersion). */}}
{{- define "pathmend.image" -}}
{{ .Values.image.repository }}:{{ .Values.image.tag | default .Chart.AppVersion }}
{{- end -}}

{{/* kubelet's directory, without a trailing slash. */}}
{{- define "pathmend.kubeletDir" -}}
{{ trimSuffix "/" .Values.kubeletDir }}
{{- end -}}

{{/* The node plugin's heal flags that are set (an empty value keeps pathmend's default). */}}
{{- define "pathmend.healArgs" -}}
{{- $flags := dict "monitorInterval" "monitor-interval" "grace" "heal-grace" "cooldown" "heal-cooldown" "maxScope" "heal-max-scope" "iscsiScope" "heal-iscsi-scope" "iscsiStuckThreshold" "iscsi-stuck-threshold" "iscsidRestartCooldown" "iscsid-restart-cooldown" "connectTimeout" "connect-timeout" -}}
{{- range $key := keys $flags | sortAlpha }}
{{- $v := index $.Values.heal $key }}
{{- if $v }}
- --{{ index $flags $key }}={{ $v }}
{{- end }}
{{- end }}
{{- end -}}

{{/* The nodes the DaemonSets run on: Linux nodes, narrowed by .Values.nodeSelector. */}}
{{- define "pathmend.nodeSelector" -}}
{{ toYaml (merge (dict) .Values.nodeSelector (dict "kubernetes.io/os" "linux")) }}
{{- end -}}
