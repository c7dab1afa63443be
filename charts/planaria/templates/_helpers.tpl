{{/* Names, labels and derived values shared by the templates. */}}

{{/* The chart name, or nameOverride. */}}
{{- define "planaria.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* The prefix of every object name: fullnameOverride, else the release name (with the chart
name appended unless the release name already holds it). */}}
{{- define "planaria.fullname" -}}
{{- if .Values.fullnameOverride }}
{{- .Values.fullnameOverride | trunc 63 | trimSuffix "-" }}
{{- else }}
{{- $name := default .Chart.Name .Values.nameOverride }}
{{- if contains $name .Release.Name }}
{{- .Release.Name | trunc 63 | trimSuffix "-" }}
{{- else }}
{{- printf "%s-%s" .Release.Name $name | trunc 63 | trimSuffix "-" }}
{{- end }}
{{- end }}
{{- end }}

{{/* Labels selecting the operator pods. */}}
{{- define "planaria.selectorLabels" -}}
app.kubernetes.io/name: {{ include "planaria.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/component: operator
{{- end }}

{{/* Labels of every object the chart creates. */}}
{{- define "planaria.labels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{ include "planaria.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
{{- end }}

{{/* The operator's ServiceAccount. */}}
{{- define "planaria.serviceAccountName" -}}
{{- if .Values.serviceAccount.create }}
{{- default (include "planaria.fullname" .) .Values.serviceAccount.name }}
{{- else }}
{{- required "serviceAccount.name: give the existing ServiceAccount's name (serviceAccount.create is false)" .Values.serviceAccount.name }}
{{- end }}
{{- end }}

{{/* The operator image. */}}
{{- define "planaria.image" -}}
{{- printf "%s:%s" .Values.image.repository (default .Chart.AppVersion .Values.image.tag) }}
{{- end }}

{{/* The worker pods' default image. */}}
{{- define "planaria.agentImage" -}}
{{- default (include "planaria.image" .) .Values.agentImage }}
{{- end }}

{{/* The watched namespaces, one per line (default: the release namespace). */}}
{{- define "planaria.namespaces" -}}
{{- range (.Values.watchNamespaces | default (list .Release.Namespace)) }}
{{ . }}
{{- end }}
{{- end }}
