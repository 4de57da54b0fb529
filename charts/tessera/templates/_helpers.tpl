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

{{/*
Whether kube-scheduler authenticates to the extender's verbs with a client
certificate (the extender's --verbs-client-ca): "true" or "". On with
extender.tls.verbAuth and HTTPS, when there is a client certificate (mode
generate makes one; mode secret needs extender.tls.clientSecretName) and
the verbs are served (mode plugin serves none: its scheduler calls the
extender in the process).
*/}}
{{- define "tessera.verbAuth" -}}
{{- $tls := .Values.extender.tls -}}
{{- if and $tls.verbAuth (include "tessera.extenderTLS" .) (ne .Values.scheduler.mode "plugin") (or (eq $tls.mode "generate") $tls.clientSecretName) }}true{{ end -}}
{{- end -}}

{{/*
The Secret holding kube-scheduler's client certificate for the verbs
(tls.crt, tls.key) and the CA that signed it (ca.crt).
*/}}
{{- define "tessera.schedulerClientSecretName" -}}
{{- if eq .Values.extender.tls.mode "secret" }}{{ .Values.extender.tls.clientSecretName }}{{ else }}tessera-scheduler-client-tls{{ end -}}
{{- end -}}

{{/* Where the extender finds the CA of the verbs' client certificates, and kube-scheduler its client certificate. */}}
{{- define "tessera.verbsClientCADir" -}}/etc/tessera-verbs-ca{{- end -}}
{{- define "tessera.schedulerClientDir" -}}/etc/tessera-scheduler-client{{- end -}}

{{/* The extender's DNS names, for its serving certificate. */}}
{{- define "tessera.extenderDNSNames" -}}
{{- $ns := include "tessera.extenderNamespace" . -}}
{{- list "tessera-extender" (printf "tessera-extender.%s" $ns) (printf "tessera-extender.%s.svc" $ns) (printf "tessera-extender.%s.svc.cluster.local" $ns) | toJson -}}
{{- end -}}

{{/*
The extender's TLS material as JSON {"ca", "crt", "key", "clientCrt",
"clientKey"} (each base64 of PEM), the same in every template of one
render: computed once and kept on the root context. tls.mode generate: the
Secrets tessera-extender-tls and (with verb authentication)
tessera-scheduler-client-tls when they already exist and hold all of it
(upgrades keep the CA the webhooks and kube-scheduler trust), else a new
CA, a certificate for the Service's names (and extender.service.clusterIP)
and a client certificate for kube-scheduler, from Helm's genCA /
genSignedCert (the CA's key is kept nowhere: a missing client certificate
means new ones all). tls.mode secret: only the CA, from
extender.tls.caBundle.
*/}}
{{- define "tessera.tlsMaterial" -}}
{{- $root := . -}}
{{- if not (hasKey $root "tesseraTLSMaterial") -}}
{{- $tls := $root.Values.extender.tls -}}
{{- $m := dict -}}
{{- if eq $tls.mode "generate" -}}
{{- $ns := include "tessera.extenderNamespace" $root -}}
{{- $old := lookup "v1" "Secret" $ns "tessera-extender-tls" -}}
{{- $oldClient := lookup "v1" "Secret" $ns "tessera-scheduler-client-tls" -}}
{{- $clientKept := or (not (include "tessera.verbAuth" $root)) (and $oldClient $oldClient.data (index $oldClient.data "tls.crt") (index $oldClient.data "tls.key") (eq (index $oldClient.data "ca.crt") (dig "data" "ca.crt" "" $old))) -}}
{{- if and $old $old.data (index $old.data "ca.crt") (index $old.data "tls.crt") (index $old.data "tls.key") $clientKept -}}
{{- $m = dict "ca" (index $old.data "ca.crt") "crt" (index $old.data "tls.crt") "key" (index $old.data "tls.key") -}}
{{- if and $oldClient $oldClient.data -}}
{{- $_ := set $m "clientCrt" (index $oldClient.data "tls.crt" | default "") -}}
{{- $_ := set $m "clientKey" (index $oldClient.data "tls.key" | default "") -}}
{{- end -}}
{{- else -}}
{{- $days := int $tls.validityDays -}}
{{- $ca := genCA "tessera-extender-ca" $days -}}
{{- $ips := list -}}
{{- with $root.Values.extender.service.clusterIP }}{{ $ips = append $ips . }}{{ end -}}
{{- $names := include "tessera.extenderDNSNames" $root | fromJsonArray -}}
{{- $cert := genSignedCert (printf "tessera-extender.%s.svc" $ns) $ips $names $days $ca -}}
{{- $client := genSignedCert "tessera-scheduler" (list) (list) $days $ca -}}
{{- $m = dict "ca" ($ca.Cert | b64enc) "crt" ($cert.Cert | b64enc) "key" ($cert.Key | b64enc) "clientCrt" ($client.Cert | b64enc) "clientKey" ($client.Key | b64enc) -}}
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

{{/*
The extender's command-line flags, as YAML list items (with comments) at
column 0: tessera-extender's args in its Deployment, and the Tessera plugin's
args.flags in tessera-scheduler's configuration (mode plugin). Argument:
dict "root" $ "schedulerNames" S "verbosity" B "verbs" V: S the
--scheduler-names value (the profiles that call the extender); B adds
--v=extender.logLevel (left out of the plugin's flags: klog's verbosity is
one per process, and tessera-scheduler's own --v sets it); V: the process
serves the HTTP verbs (tessera-extender; the plugin's extender serves
none), which then get --verbs-client-ca with tessera.verbAuth.
*/}}
{{- define "tessera.extenderArgs" -}}
{{- $root := .root -}}
{{- $v := $root.Values.extender -}}
- --listen=:{{ $v.port }}
- --policy={{ $v.policy }}
# filter passes the {{ $v.filterShortlist }} fitting nodes the policy scores best
# (docs/extender.md); 0 passes every fitting node.
- --filter-shortlist={{ $v.filterShortlist }}
# The policy's target workload is learned from the last
# {{ $v.learnWorkload }} GPU pods (docs/extender.md); 0: fixed.
- --learn-workload={{ $v.learnWorkload }}
# The kube-scheduler profiles that call the extender: the gang planner
# plans their pods (a pod of another scheduler only when gated).
- --scheduler-names={{ .schedulerNames }}
{{- $extNS := include "tessera.extenderNamespace" $root }}
{{- if ne $extNS "kube-system" }}
# The seal key Secret lives in the extender's own namespace.
- --seal-key-namespace={{ $extNS }}
{{- end }}
{{- with $v.metricsPort }}
- --metrics-listen=:{{ . }}
{{- end }}
{{- if .verbosity }}
- --v={{ $v.logLevel }}
{{- end }}
{{- if include "tessera.extenderTLS" $root }}
# HTTPS: the API server calls webhooks over HTTPS only.
- --tls-cert=/etc/tessera-extender/tls.crt
- --tls-key=/etc/tessera-extender/tls.key
{{- if and .verbs (include "tessera.verbAuth" $root) }}
# The scheduler verbs (filter, prioritize, bind, preempt) answer only
# kube-scheduler's client certificate, not every pod that reaches the
# Service; the webhooks, /status and /metrics need none.
- --verbs-client-ca={{ include "tessera.verbsClientCADir" $root }}/ca.crt
{{- else if .verbs }}
# Without --verbs-client-ca the scheduler verbs (bind, preempt, ...) answer
# every pod that reaches the Service (extender.tls.verbAuth).
{{- end }}
{{- else }}
# For HTTPS, mount a certificate and add:
# - --tls-cert=/etc/tessera-extender/tls.crt
# - --tls-key=/etc/tessera-extender/tls.key
{{- if .verbs }}
# and, so that the scheduler verbs (bind, preempt, ...) answer only
# kube-scheduler, the CA of its client certificate (tlsConfig certFile and
# keyFile in scheduler-config.yaml):
# - --verbs-client-ca=/etc/tessera-verbs-ca/ca.crt
{{- end }}
{{- end }}
{{- with $v.extraArgs }}
{{ toYaml . }}
{{- end }}
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
{{- $tlsConfig := printf "{caData: %s}" $ca -}}
{{- if and $https (include "tessera.verbAuth" $root) -}}
{{- $dir := include "tessera.schedulerClientDir" $root -}}
{{- $tlsConfig = printf "{caData: %s, certFile: %s/tls.crt, keyFile: %s/tls.key}" $ca $dir $dir -}}
{{- end -}}
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
{{- if include "tessera.verbAuth" $root }}
  # kube-scheduler's client certificate: the extender's verbs answer no
  # other caller ({{ include "tessera.schedulerClientDir" $root }}, from the Secret
  # {{ include "tessera.schedulerClientSecretName" $root }}).
{{- end }}
  tlsConfig: {{ $tlsConfig }}
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
  tlsConfig: {{ $tlsConfig }}
{{- end }}
{{- end -}}

{{/*
The KubeSchedulerConfiguration of tessera-scheduler (kube-scheduler with
Tessera's plugin and the extender in its process, scheduler/ in the
repository), with the extender's flags as the Tessera plugin's args.
Argument: dict "root" $ "profiles" P "leaderElection" B, as
tessera.schedulerConfig: P "both" (default-scheduler and tessera-scheduler,
to replace the cluster's kube-scheduler: deploy/scheduler/scheduler-config.yaml)
or "tessera" (tessera-scheduler only, beside the default scheduler: mode
plugin), B its own leader election lease.
*/}}
{{- define "tessera.pluginSchedulerConfig" -}}
{{- $root := .root -}}
{{- $both := eq .profiles "both" -}}
{{- $names := ternary "default-scheduler,tessera-scheduler" "tessera-scheduler" $both -}}
# KubeSchedulerConfiguration for tessera-scheduler: kube-scheduler with
# Tessera's plugin compiled in (scheduler/, docs/extender.md "In-process
# plugin: tessera-scheduler"). Tessera's extender runs inside the scheduler
# and the plugin calls it where kube-scheduler would call the extender's
# HTTP verbs:
#
# - preFilter: the extender's filter, once per pod, over every node whose
#   taints and required node affinity the pod passes; only the nodes it
#   passes (its shortlist) are filtered further by the stock plugins.
# - postFilter, before DefaultPreemption: a pod whose shortlist all failed
#   the stock filters is tried again at once with every node that fits; a
#   pod whose room is being freed is not preempted for again.
# - preScore/score: the extender's prioritize (GPU pods) and
#   prioritize-cpu (CPU-only pods), weighted as the extender entries are.
# - reserve: the pod's GPUs counted in the ledger within its cycle.
# - bind: the extender's bind (the assignment of a shared pod written
#   first); CPU-only pods go on to DefaultBinder.
#
# The plugin only acts on pods that ask for a Tessera resource, but for the
# CPU-only score. Its args are the extender's flags (tessera-extender
# --help), the same in every profile (one extender runs per process); the
# extender serves its webhooks, /status and /metrics on --listen as it does
# alone, and talks to the API server as the pod's ServiceAccount
# (tessera-extender, the one Tessera's admission policy lets write pod
# decisions): outside a pod, add --kubeconfig for that identity.
{{- if $both }}
#
# Two profiles: default-scheduler keeps the stock plugins but for Tessera's,
# so that the file can replace the configuration of the cluster's
# kube-scheduler; tessera-scheduler (pods opt in with spec.schedulerName)
# also scores NodeResourcesFit MostAllocated, so that ties between the
# extender's best nodes are broken towards packing, like the binpack policy.
{{- else }}
#
# One profile, tessera-scheduler (pods opt in with spec.schedulerName), for
# a scheduler that runs beside the cluster's default one: it also scores
# NodeResourcesFit MostAllocated, so that ties between the extender's best
# nodes are broken towards packing, like the binpack policy.
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
{{- if $both }}
- schedulerName: default-scheduler
  {{- include "tessera.pluginProfile" (dict "root" $root "schedulerNames" $names) | nindent 2 }}
{{- end }}
- schedulerName: tessera-scheduler
  {{- include "tessera.pluginProfile" (dict "root" $root "schedulerNames" $names) | nindent 2 }}
  - name: NodeResourcesFit
    args:
      scoringStrategy:
        type: MostAllocated
        resources:
        - {name: cpu, weight: 1}
        - {name: memory, weight: 1}
{{- end -}}

{{/*
One profile's plugins and Tessera's pluginConfig entry (its last key, so
that a profile may add entries). Argument: dict "root" $ "schedulerNames" S
(tessera.extenderArgs).
*/}}
{{- define "tessera.pluginProfile" -}}
plugins:
  preFilter:
    enabled: [{name: Tessera}]
  postFilter:
    # Tessera first: a pod whose shortlist failed is retried with every
    # fitting node before anything is preempted for it.
    disabled: [{name: "*"}]
    enabled: [{name: Tessera}, {name: DefaultPreemption}]
  preScore:
    enabled: [{name: Tessera}]
  score:
    # One extender step (0..10) is 10 plugin points, times 200: 2000,
    # more than all stock score plugins together (at most 1200).
    enabled: [{name: Tessera, weight: 200}]
  reserve:
    enabled: [{name: Tessera}]
  bind:
    # Tessera first: it binds the pods that ask for a Tessera resource and
    # passes every other pod on to DefaultBinder.
    disabled: [{name: "*"}]
    enabled: [{name: Tessera}, {name: DefaultBinder}]
pluginConfig:
- name: Tessera
  args:
    # tessera-extender's flags.
    flags:
    {{- include "tessera.extenderArgs" (dict "root" .root "schedulerNames" .schedulerNames "verbosity" false) | nindent 4 }}
{{- end -}}
