{{/* The image of every component: repository:tag, the tag defaulting to the appVersion. */}}
{{- define "tensile.image" -}}
{{ .Values.image.repository }}:{{ .Values.image.tag | default .Chart.AppVersion }}
{{- end -}}
