{{- define "rlark.fullname" -}}
{{- if contains .Chart.Name .Release.Name -}}
{{- .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name .Chart.Name | trunc 63 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}

{{- define "rlark.labels" -}}
app.kubernetes.io/name: {{ .Chart.Name }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version }}
{{- end -}}

{{- define "rlark.selectorLabels" -}}
app.kubernetes.io/name: {{ .Chart.Name }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/component: server
{{- end -}}

{{/* The names the serving certificate carries: the external host first (the default
advertised address when listening on 0.0.0.0), then the Service's. */}}
{{- define "rlark.tlsSans" -}}
{{- $sans := list -}}
{{- if or .Values.ingress.enabled .Values.gateway.enabled -}}
{{- $sans = append $sans .Values.ingress.host -}}
{{- range .Values.gateway.hostnames }}{{ $sans = append $sans . }}{{ end -}}
{{- end -}}
{{- $svc := include "rlark.fullname" . -}}
{{- $sans = concat $sans (list $svc (printf "%s.%s" $svc .Release.Namespace) (printf "%s.%s.svc" $svc .Release.Namespace)) -}}
{{- $sans = concat $sans .Values.tlsSans -}}
{{- toJson (uniq $sans) -}}
{{- end -}}

{{- define "rlark.postgresSecret" -}}
{{- if .Values.store.postgres.existingSecret -}}
{{- .Values.store.postgres.existingSecret -}}
{{- else -}}
{{- printf "%s-store" (include "rlark.fullname" .) -}}
{{- end -}}
{{- end -}}
