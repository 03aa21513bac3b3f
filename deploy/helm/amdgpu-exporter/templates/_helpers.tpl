{{/* Labels every object gets on top of the kustomize manifest's own. */}}
{{- define "amdgpu-exporter.labels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | quote }}
app.kubernetes.io/instance: {{ .Release.Name | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service | quote }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
{{- end -}}

{{/*
One kustomize manifest from files/ (links into deploy/kubernetes), as a dict, with the release's
namespace and the chart's labels added: what kustomize's `namespace:` does, plus Helm's labels.
Call: include "amdgpu-exporter.manifest" (list $ "files/service.yaml") | fromYaml
*/}}
{{- define "amdgpu-exporter.manifest" -}}
{{- $root := index . 0 -}}
{{- $object := $root.Files.Get (index . 1) | fromYaml -}}
{{- $meta := $object.metadata -}}
{{- $_ := set $meta "namespace" $root.Release.Namespace -}}
{{- $_ := set $meta "labels" (merge (dict) (include "amdgpu-exporter.labels" $root | fromYaml) ($meta.labels | default dict)) -}}
{{- toYaml $object -}}
{{- end -}}

{{/* The rules ConfigMap's data: the in-daemon alert rules and, when set, the config file. */}}
{{- define "amdgpu-exporter.rulesData" -}}
rules.yaml: {{ .Values.rules | default (.Files.Get "files/default-rules.yaml") | toYaml | indent 2 | trim }}
{{- if .Values.config }}
config.yaml: {{ toYaml .Values.config | toYaml | indent 2 | trim }}
{{- end }}
{{- end -}}

{{/* The web-config server name tls.crt must carry. */}}
{{- define "amdgpu-exporter.serverName" -}}
{{- .Values.webConfig.serverName | default (printf "amdgpu-exporter.%s.svc" .Release.Namespace) -}}
{{- end -}}

{{/* ServiceMonitor / PodMonitor endpoint settings shared by both: $root, the monitor's values, and the base endpoint. */}}
{{- define "amdgpu-exporter.endpoint" -}}
{{- $root := index . 0 -}}
{{- $values := index . 1 -}}
{{- $endpoint := index . 2 -}}
{{- $_ := set $endpoint "interval" $values.interval -}}
{{- $_ := set $endpoint "scrapeTimeout" $values.scrapeTimeout -}}
{{- $_ := set $endpoint "relabelings" (concat $endpoint.relabelings $values.relabelings) -}}
{{- if $values.metricRelabelings -}}
{{- $_ := set $endpoint "metricRelabelings" $values.metricRelabelings -}}
{{- end -}}
{{- if $root.Values.webConfig.enabled -}}
{{- $_ := set $endpoint "scheme" "https" -}}
{{- $_ := set $endpoint "tlsConfig" (dict "ca" (dict "secret" (dict "name" $root.Values.webConfig.secretName "key" "ca.crt")) "serverName" (include "amdgpu-exporter.serverName" $root) "insecureSkipVerify" false) -}}
{{- $scrape := $root.Values.webConfig.scrapeSecretName -}}
{{- $_ := set $endpoint "basicAuth" (dict "username" (dict "name" $scrape "key" "username") "password" (dict "name" $scrape "key" "password")) -}}
{{- end -}}
{{- toYaml $endpoint -}}
{{- end -}}
