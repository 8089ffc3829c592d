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

{{/* The headless Service that gives each replica of a StatefulSet its DNS name. */}}
{{- define "rlark.peersService" -}}
{{- printf "%s-peers" (include "rlark.fullname" .) | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{/* Values the chart refuses, each with the reason. */}}
{{- define "rlark.checkValues" -}}
{{- $postgres := or .Values.store.postgres.url .Values.store.postgres.existingSecret -}}
{{- if lt (int .Values.replicaCount) 1 }}
{{- fail "replicaCount must be at least 1" }}
{{- end }}
{{- if gt (int .Values.replicaCount) 1 }}
{{- if not $postgres }}
{{- fail "replicaCount > 1 needs a PostgreSQL store (store.postgres): the replicas share one database (SQLite admits one server)" }}
{{- end }}
{{- if not .Values.ca.sealingSecret.existingSecret }}
{{- fail "replicaCount > 1 needs ca.sealingSecret.existingSecret: the replicas share the installation's CAs through the store, sealed with that secret (docs/operations.md, Several replicas)" }}
{{- end }}
{{- if .Values.persistence.existingClaim }}
{{- fail "persistence.existingClaim cannot be shared by replicaCount > 1 replicas: each gets a volume of its own from the StatefulSet" }}
{{- end }}
{{- end }}
{{- if and (not .Values.persistence.enabled) (not (or .Values.ca.existingSecret .Values.ca.sealingSecret.existingSecret)) }}
{{- fail "persistence.enabled=false needs ca.existingSecret or ca.sealingSecret.existingSecret: a data directory that is lost at every restart would make a new CA each time" }}
{{- end }}
{{- if and .Values.proxy.enabled (eq .Values.proxy.host .Values.ingress.host) }}
{{- fail "proxy.host must differ from ingress.host: task web apps need an origin of their own" }}
{{- end }}
{{- if and (not .Values.persistence.enabled) (not $postgres) }}
{{- fail "persistence.enabled=false needs a PostgreSQL store (store.postgres): the SQLite store lives in the data volume" }}
{{- end }}
{{- end -}}
