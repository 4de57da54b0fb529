{{/*
Helpers of the tessera chart. Object names are fixed: Tessera is one per
cluster, and its parts find each other by these names (the admission policy
by the ServiceAccounts', the node agents by the seal key Secret's).
*/}}

{{/* The node agent's namespace: the release's. */}}
{{- define "tessera.nodeNamespace" -}}
{{ .Release.Namespace }}
{{- end -}}

{{/* The extender's namespace (and the seal key's, and the scheduler's). */}}
{{- define "tessera.extenderNamespace" -}}
{{ .Values.extender.namespace | default .Release.Namespace }}
{{- end -}}

{{/*
Labels of an object. Argument: dict "root" $ "name" NAME (name may be
empty: only part-of then).
*/}}
{{- define "tessera.labels" -}}
{{- $l := dict "app.kubernetes.io/part-of" "tessera" -}}
{{- if .name }}{{ $_ := set $l "app.kubernetes.io/name" .name }}{{ end -}}
{{- if .root.Values.helmLabels -}}
{{- $_ := set $l "app.kubernetes.io/instance" .root.Release.Name -}}
{{- $_ := set $l "app.kubernetes.io/managed-by" .root.Release.Service -}}
{{- $_ := set $l "app.kubernetes.io/version" .root.Chart.AppVersion -}}
{{- $_ := set $l "helm.sh/chart" (printf "%s-%s" .root.Chart.Name .root.Chart.Version | replace "+" "_") -}}
{{- end -}}
{{- range $k, $v := .root.Values.commonLabels }}{{ $_ := set $l $k $v }}{{ end -}}
{{- toYaml $l -}}
{{- end -}}

{{/* A Tessera image. Argument: dict "root" $ "image" (.Values.node.image or .Values.extender.image). */}}
{{- define "tessera.image" -}}
{{- $repo := .image.repository | default .root.Values.image.repository -}}
{{- $tag := .image.tag | default .root.Values.image.tag | default .root.Chart.AppVersion -}}
{{ printf "%s:%s" $repo $tag }}
{{- end -}}

{{/* The ServiceAccount user names the admission policy exempts. */}}
{{- define "tessera.extenderUser" -}}
system:serviceaccount:{{ include "tessera.extenderNamespace" . }}:tessera-extender
{{- end -}}
{{- define "tessera.nodeUser" -}}
system:serviceaccount:{{ include "tessera.nodeNamespace" . }}:tessera-node
{{- end -}}

{{/* Whether the extender serves HTTPS: "true" or "". */}}
{{- define "tessera.extenderTLS" -}}
{{- if ne .Values.extender.tls.mode "none" }}true{{ end -}}
{{- end -}}

{{/* The extender's DNS names, for its serving certificate. */}}
{{- define "tessera.extenderDNSNames" -}}
{{- $ns := include "tessera.extenderNamespace" . -}}
{{- list "tessera-extender" (printf "tessera-extender.%s" $ns) (printf "tessera-extender.%s.svc" $ns) (printf "tessera-extender.%s.svc.cluster.local" $ns) | toJson -}}
{{- end -}}

{{/*
The extender's TLS material as JSON {"ca", "crt", "key"} (each base64 of
PEM), the same in every template of one render: computed once and kept on
the root context. tls.mode generate: the Secret tessera-extender-tls when it
already exists and holds all three (upgrades keep the CA the webhooks and
kube-scheduler trust), else a new CA and a certificate for the Service's
names (and extender.service.clusterIP) from Helm's genCA / genSignedCert.
tls.mode secret: only the CA, from extender.tls.caBundle.
*/}}
{{- define "tessera.tlsMaterial" -}}
{{- $root := . -}}
{{- if not (hasKey $root "tesseraTLSMaterial") -}}
{{- $tls := $root.Values.extender.tls -}}
{{- $m := dict -}}
{{- if eq $tls.mode "generate" -}}
{{- $ns := include "tessera.extenderNamespace" $root -}}
{{- $old := lookup "v1" "Secret" $ns "tessera-extender-tls" -}}
{{- if and $old $old.data (index $old.data "ca.crt") (index $old.data "tls.crt") (index $old.data "tls.key") -}}
{{- $m = dict "ca" (index $old.data "ca.crt") "crt" (index $old.data "tls.crt") "key" (index $old.data "tls.key") -}}
{{- else -}}
{{- $days := int $tls.validityDays -}}
{{- $ca := genCA "tessera-extender-ca" $days -}}
{{- $ips := list -}}
{{- with $root.Values.extender.service.clusterIP }}{{ $ips = append $ips . }}{{ end -}}
{{- $names := include "tessera.extenderDNSNames" $root | fromJsonArray -}}
{{- $cert := genSignedCert (printf "tessera-extender.%s.svc" $ns) $ips $names $days $ca -}}
{{- $m = dict "ca" ($ca.Cert | b64enc) "crt" ($cert.Cert | b64enc) "key" ($cert.Key | b64enc) -}}
{{- end -}}
{{- else if eq $tls.mode "secret" -}}
{{- if not $tls.secretName -}}
{{- fail "extender.tls.mode secret needs extender.tls.secretName: a kubernetes.io/tls Secret in the extender's namespace" -}}
{{- end -}}
{{- if not $tls.caBundle -}}
{{- fail "extender.tls.mode secret needs extender.tls.caBundle: base64 of the PEM CA that signed the Secret's certificate" -}}
{{- end -}}
{{- $m = dict "ca" $tls.caBundle -}}
{{- end -}}
{{- $_ := set $root "tesseraTLSMaterial" $m -}}
{{- end -}}
{{- index $root "tesseraTLSMaterial" | toJson -}}
{{- end -}}

{{/* The Secret holding the extender's certificate. */}}
{{- define "tessera.tlsSecretName" -}}
{{- if eq .Values.extender.tls.mode "secret" }}{{ .Values.extender.tls.secretName }}{{ else }}tessera-extender-tls{{ end -}}
{{- end -}}

{{/* The URL kube-scheduler calls the extender at. */}}
{{- define "tessera.extenderURL" -}}
{{- if .Values.scheduler.extenderURL -}}
{{ .Values.scheduler.extenderURL }}
{{- else -}}
{{ if include "tessera.extenderTLS" . }}https{{ else }}http{{ end }}://tessera-extender.{{ include "tessera.extenderNamespace" . }}.svc:{{ .Values.extender.port }}
{{- end -}}
{{- end -}}

{{/*
The KubeSchedulerConfiguration that plugs the extender into kube-scheduler.
Argument: dict "root" $ "profiles" P "leaderElection" B. P "both":
default-scheduler and tessera-scheduler, to replace the configuration of the
cluster's kube-scheduler (deploy/extender/scheduler-config.yaml, mode
configmap); "tessera": tessera-scheduler only, for a second scheduler beside
the default one (mode deployment), with B its own leader election lease.
*/}}
{{- define "tessera.schedulerConfig" -}}
{{- $root := .root -}}
{{- $url := include "tessera.extenderURL" $root -}}
{{- $https := hasPrefix "https://" $url -}}
{{- $ca := "" -}}
{{- if $https }}{{ $ca = (include "tessera.tlsMaterial" $root | fromJson).ca }}{{ end -}}
# KubeSchedulerConfiguration for kube-scheduler with tessera-extender.
# docs/extender.md explains every setting; in short:
#
# - Extenders apply to every profile of the scheduler. The first entry
#   handles pods that request a Tessera resource (managedResources): it
#   filters, scores, binds (writing the pod's GPU assignment first) and
#   vets preemption victims. The second entry only scores, and only
#   CPU-only pods (its verb gives GPU pods a flat score): without
#   managedResources kube-scheduler calls it for every pod, which is the
#   only way to steer CPU-only pods away from the CPU that GPU nodes need.
{{- if eq .profiles "both" }}
# - Two profiles: default-scheduler keeps the stock plugins, so the file can
#   replace the default scheduler's configuration; tessera-scheduler (pods
#   opt in with spec.schedulerName) scores NodeResourcesFit MostAllocated so
#   that ties between the extender's best nodes are broken towards packing,
#   like the binpack policy.
{{- else }}
# - One profile, tessera-scheduler (pods opt in with spec.schedulerName), for
#   a scheduler that runs beside the cluster's default one: it scores
#   NodeResourcesFit MostAllocated so that ties between the extender's best
#   nodes are broken towards packing, like the binpack policy.
{{- end }}
apiVersion: kubescheduler.config.k8s.io/v1
kind: KubeSchedulerConfiguration
{{- if .leaderElection }}
# Its own lease, beside the default scheduler's kube-system/kube-scheduler.
leaderElection:
  leaderElect: true
  resourceName: tessera-scheduler
  resourceNamespace: {{ include "tessera.extenderNamespace" $root }}
{{- end }}
# Score every feasible node: the extender's policy compares nodes, and a
# sample (the default adapts down to 5% on large clusters) would hide the
# node that keeps GPUs unfragmented.
percentageOfNodesToScore: 100
profiles:
{{- if eq .profiles "both" }}
- schedulerName: default-scheduler
{{- end }}
- schedulerName: tessera-scheduler
  pluginConfig:
  - name: NodeResourcesFit
    args:
      scoringStrategy:
        type: MostAllocated
        resources:
        - {name: cpu, weight: 1}
        - {name: memory, weight: 1}
extenders:
- urlPrefix: {{ $url }}
  filterVerb: filter
  prioritizeVerb: prioritize
  bindVerb: bind
  preemptVerb: preempt
  # One extender score step (0..10) is worth 10 * weight points; the stock
  # score plugins add up to at most 1200 (weights 3+2+2+2+1+1+1 times 100).
  # 200 makes one step (2000) outweigh all of them: the extender decides.
  weight: 200
  # The extender keeps its own node cache from informers: the scheduler
  # sends node names, not whole Node objects (much smaller requests).
  nodeCacheCapable: true
  # Only pods that ask for a Tessera resource are sent to this entry.
  # ignoredByScheduler: false keeps kube-scheduler's own node-level count
  # check of these extended resources as a safety net; the extender adds
  # the per-GPU check the scheduler cannot do.
  managedResources:
  - {name: tessera.dev/gpu, ignoredByScheduler: false}
  - {name: tessera.dev/gpu-memory, ignoredByScheduler: false}
  - {name: tessera.dev/gpu-core, ignoredByScheduler: false}
  # One resource per MIG profile (managedResources names resources, not
  # prefixes): scheduler.migProfiles.
  {{- range $root.Values.scheduler.migProfiles }}
  - {name: tessera.dev/mig-{{ . }}, ignoredByScheduler: false}
  {{- end }}
  # A GPU pod must not be placed without the extender: shared pods need the
  # assignment it writes at bind.
  ignorable: false
  httpTimeout: 30s
  enableHTTPS: {{ $https }}
{{- if $https }}
  tlsConfig: {caData: {{ $ca }}}
{{- end }}
- urlPrefix: {{ $url }}
  prioritizeVerb: prioritize-cpu
  # A nudge, not a veto: one step is worth 200 points, about two stock
  # plugins at their maximum.
  weight: 20
  nodeCacheCapable: true
  # CPU-only pods schedule normally when the extender is down.
  ignorable: true
  httpTimeout: 5s
{{- if $https }}
  enableHTTPS: true
  tlsConfig: {caData: {{ $ca }}}
{{- end }}
{{- end -}}
