{{/* Names, labels, the image, and gputally's config. */}}

{{- define "gputally.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{- define "gputally.fullname" -}}
{{- if .Values.fullnameOverride -}}
{{- .Values.fullnameOverride | trunc 50 | trimSuffix "-" -}}
{{- else if contains (include "gputally.name" .) .Release.Name -}}
{{- .Release.Name | trunc 50 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name (include "gputally.name" .) | trunc 50 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}

{{/* The gputally server's component: its workload, ConfigMap and ServiceAccount are
     <fullname>-<component>. */}}
{{- define "gputally.component" -}}
{{- get (dict "gateway" "gateway" "sidecar" "node" "pipeline-stage" "stage" "scale-out" "replica") .Values.shape -}}
{{- end -}}

{{- define "gputally.serviceAccountName" -}}
{{- default (printf "%s-%s" (include "gputally.fullname" .) (include "gputally.component" .)) .Values.serviceAccount.name -}}
{{- end -}}

{{/* Selector labels of a component: call with (list $ "gateway"). */}}
{{- define "gputally.selectorLabels" -}}
{{- $ := index . 0 -}}
app.kubernetes.io/name: {{ include "gputally.name" $ }}
app.kubernetes.io/instance: {{ $.Release.Name }}
app.kubernetes.io/component: {{ index . 1 }}
{{- end -}}

{{/* All labels of a component's objects: call with (list $ "gateway"). */}}
{{- define "gputally.labels" -}}
{{- $ := index . 0 -}}
{{ include "gputally.selectorLabels" . }}
app.kubernetes.io/version: {{ $.Chart.AppVersion | quote }}
{{- if $.Values.helmLabels }}
app.kubernetes.io/managed-by: {{ $.Release.Service }}
helm.sh/chart: {{ printf "%s-%s" $.Chart.Name $.Chart.Version }}
{{- end }}
{{- with $.Values.commonLabels }}
{{ toYaml . }}
{{- end }}
{{- end -}}

{{/* An image reference from a map with repository/tag/digest, defaults from .Values.image. */}}
{{- define "gputally.image" -}}
{{- $ := index . 0 -}}
{{- $img := mergeOverwrite (deepCopy $.Values.image) (index . 1 | default dict) -}}
{{- if $img.digest -}}
{{- printf "%s@%s" $img.repository $img.digest -}}
{{- else -}}
{{- printf "%s:%s" $img.repository (default $.Chart.AppVersion $img.tag) -}}
{{- end -}}
{{- end -}}

{{- define "gputally.exporterEndpoint" -}}
{{- $port := get (dict "gateway" "4317" "sidecar" "4317" "scale-out" "4319") .Values.shape -}}
{{- default (printf "http://otel-collector.observability.svc:%s" $port) .Values.exporter.endpoint -}}
{{- end -}}

{{/* The Secret with the backend's token; none for pipeline-stage, which exports nothing. */}}
{{- define "gputally.backendSecret" -}}
{{- if eq .Values.shape "pipeline-stage" -}}
{{- else if .Values.exporter.existingSecret -}}
{{- .Values.exporter.existingSecret -}}
{{- else if .Values.exporter.token -}}
{{- printf "%s-backend" (include "gputally.fullname" .) -}}
{{- end -}}
{{- end -}}

{{- define "gputally.slurmSecret" -}}
{{- default (printf "%s-slurm" (include "gputally.fullname" .)) .Values.slurm.existingSecret -}}
{{- end -}}

{{/* gputally's config as YAML: the shape's file, the chart's adjustments, then .Values.config. */}}
{{- define "gputally.config" -}}
{{- $path := printf "files/config/%s.yaml" .Values.shape -}}
{{- $text := .Files.Get $path -}}
{{- if not $text -}}
{{- fail (printf "shape %q: no %s in the chart (shape is one of gateway, sidecar, pipeline-stage, scale-out)" .Values.shape $path) -}}
{{- end -}}
{{- $cfg := fromYaml $text -}}
{{- $service := $cfg.service -}}
{{- /* The admin endpoint on the pod IP. */ -}}
{{- $telemetry := default dict $service.telemetry -}}
{{- $metrics := default dict $telemetry.metrics -}}
{{- $_ := set $metrics "address" (printf "${env:POD_IP}:%d" (int .Values.adminPort)) -}}
{{- $_ := set $telemetry "metrics" $metrics -}}
{{- $_ := set $service "telemetry" $telemetry -}}
{{- /* slurm: in the pipelines before usage (else before batch, else last), or nowhere. */ -}}
{{- $processors := $cfg.processors -}}
{{- if .Values.slurm.enabled -}}
{{- if not (hasKey $processors "slurm") -}}
{{- $_ := set $processors "slurm" (dict "backend" "slurmrestd" "slurmrestd" (dict "endpoint" "${env:SLURMRESTD_URL}" "user" "${env:SLURMRESTD_USER}" "token_file" "/var/run/secrets/slurm/token")) -}}
{{- range $name, $pipeline := $service.pipelines -}}
{{- $before := "" -}}
{{- range list "usage" "batch" -}}
{{- if and (not $before) (has . $pipeline.processors) -}}{{- $before = . -}}{{- end -}}
{{- end -}}
{{- $new := list -}}
{{- range $pipeline.processors -}}
{{- if eq . $before -}}{{- $new = append $new "slurm" -}}{{- end -}}
{{- $new = append $new . -}}
{{- end -}}
{{- if not $before -}}{{- $new = append $new "slurm" -}}{{- end -}}
{{- $_ := set $pipeline "processors" $new -}}
{{- end -}}
{{- end -}}
{{- else -}}
{{- $_ := unset $processors "slurm" -}}
{{- range $name, $pipeline := $service.pipelines -}}
{{- $_ := set $pipeline "processors" (without $pipeline.processors "slurm") -}}
{{- end -}}
{{- end -}}
{{- /* The backend's token, from the mounted Secret. */ -}}
{{- if include "gputally.backendSecret" . -}}
{{- $extensions := default dict $cfg.extensions -}}
{{- $_ := set $extensions "bearertokenauth/backend" (dict "filename" "/var/run/secrets/gputally/backend/token") -}}
{{- $_ := set $cfg "extensions" $extensions -}}
{{- $_ := set $cfg.exporters.otlp "auth" (dict "authenticator" "bearertokenauth/backend") -}}
{{- $_ := set $service "extensions" (append (default list $service.extensions) "bearertokenauth/backend" | uniq) -}}
{{- end -}}
{{- $cfg = mustMergeOverwrite $cfg (deepCopy .Values.config) -}}
{{- toYaml $cfg -}}
{{- end -}}

{{/* The pod-level and container-level security contexts. Non-root 10001 unless the
     container must connect to the kubelet's root-only PodResources socket. */}}
{{- define "gputally.podSecurityContext" -}}
runAsNonRoot: true
runAsUser: 10001
runAsGroup: 10001
fsGroup: 10001
seccompProfile:
  type: RuntimeDefault
{{- end -}}

{{- define "gputally.securityContext" -}}
{{- $root := . -}}
{{- $capabilities := list -}}
{{- if kindIs "slice" . -}}
{{- $root = index . 0 -}}
{{- $capabilities = index . 1 -}}
{{- end -}}
{{- if $root -}}
# Root. The kubelet creates /var/lib/kubelet/pod-resources/kubelet.sock owned by root and
# writable by root only (srwxr-xr-x on the common distributions), and connecting to a Unix
# socket needs write permission on it: uid 0 passes that as the socket's owner, with no
# capability. ALL are dropped (only those added below are kept: a container of another uid
# would not hold them), the root filesystem is read-only, privilege escalation is off, and
# every host path is mounted read-only. Where the kubelet's socket is made group-accessible
# and engine discovery is off, run as 10001 with that group in supplementalGroups instead.
runAsNonRoot: false
runAsUser: 0
runAsGroup: 0
{{- else -}}
runAsNonRoot: true
runAsUser: 10001
runAsGroup: 10001
{{- end }}
readOnlyRootFilesystem: true
allowPrivilegeEscalation: false
privileged: false
capabilities:
  drop: ["ALL"]
  {{- with $capabilities }}
  add: {{ toJson . }}
  {{- end }}
seccompProfile:
  type: RuntimeDefault
{{- end -}}

{{/* The env every gputally server gets. */}}
{{- define "gputally.serverEnv" -}}
- name: POD_IP   # the admin endpoint's address (service.telemetry.metrics.address)
  valueFrom:
    fieldRef:
      fieldPath: status.podIP
{{- if ne .Values.shape "pipeline-stage" }}
- name: OTEL_EXPORTER_OTLP_ENDPOINT
  value: {{ include "gputally.exporterEndpoint" . | quote }}
{{- end }}
{{- if .Values.slurm.enabled }}
- name: SLURMRESTD_URL
  value: {{ .Values.slurm.endpoint | quote }}
- name: SLURMRESTD_USER
  value: {{ .Values.slurm.user | quote }}
{{- end }}
{{- end -}}

{{/* Liveness and readiness of a gputally server, on its admin port. */}}
{{- define "gputally.healthProbes" -}}
# /healthz: the process is alive. /readyz: 503 until the exporters have reached the backend.
livenessProbe:
  httpGet:
    path: /healthz
    port: admin
  periodSeconds: 10
  timeoutSeconds: 2
  failureThreshold: 3
readinessProbe:
  httpGet:
    path: /readyz
    port: admin
  periodSeconds: 5
  timeoutSeconds: 2
  failureThreshold: 3
{{- end -}}

{{/* Mounts and volumes of a gputally server: config, /tmp, and the Secrets in use. */}}
{{- define "gputally.serverMounts" -}}
- name: config
  mountPath: /etc/gputally
  readOnly: true
{{- if .Values.slurm.enabled }}
- name: slurm-token
  mountPath: /var/run/secrets/slurm
  readOnly: true
{{- end }}
{{- if include "gputally.backendSecret" . }}
- name: backend-token
  mountPath: /var/run/secrets/gputally/backend
  readOnly: true
{{- end }}
- name: tmp
  mountPath: /tmp
{{- end -}}

{{- define "gputally.serverVolumes" -}}
- name: config
  configMap:
    name: {{ include "gputally.fullname" . }}-{{ include "gputally.component" . }}-config
    items:
      - key: config.yaml
        path: config.yaml
{{- if .Values.slurm.enabled }}
- name: slurm-token   # token_file of the slurm processor, re-read when the Secret rotates
  secret:
    secretName: {{ include "gputally.slurmSecret" . }}
    optional: {{ not (or .Values.slurm.token .Values.slurm.existingSecret) }}
    defaultMode: 0440
{{- end }}
{{- with include "gputally.backendSecret" . }}
- name: backend-token   # bearertokenauth/backend's filename, re-read when the Secret rotates
  secret:
    secretName: {{ . }}
    defaultMode: 0440
{{- end }}
- name: tmp   # the root filesystem is read-only
  emptyDir:
    sizeLimit: 64Mi
{{- end -}}

{{/* The probe's vendor settings, with the user's overrides. */}}
{{- define "gputally.vendor" -}}
{{- $vendor := get .Values.probe.vendors .Values.probe.vendor -}}
{{- if not $vendor -}}
{{- fail (printf "probe.vendor %q: one of %s" .Values.probe.vendor (keys .Values.probe.vendors | sortAlpha | join ", ")) -}}
{{- end -}}
{{- toYaml $vendor -}}
{{- end -}}

{{/* nodeSelector and tolerations of pods on GPU nodes: (list $ overrideNodeSelector extraTolerations) */}}
{{- define "gputally.gpuNodePlacement" -}}
{{- $ := index . 0 -}}
{{- $vendor := include "gputally.vendor" $ | fromYaml -}}
nodeSelector:
  {{- toYaml (default $vendor.nodeSelector (index . 1)) | nindent 2 }}
tolerations:
  {{- toYaml (concat $vendor.tolerations (index . 2)) | nindent 2 }}
{{- end -}}

{{/* The probe container: (list $ endpoint podResources) */}}
{{- define "gputally.probeContainer" -}}
{{- $ := index . 0 -}}
{{- $endpoint := index . 1 -}}
{{- $podResources := index . 2 -}}
{{- $vendor := include "gputally.vendor" $ | fromYaml -}}
- name: probe
  image: {{ include "gputally.image" (list $ $.Values.probe.image) }}
  imagePullPolicy: {{ $.Values.image.pullPolicy }}
  args:
    - probe
    - {{ $.Values.probe.vendor }}
    - --endpoint
    - {{ $endpoint }}
    {{- if $.Values.probe.insecure }}
    - --insecure
    {{- end }}
    - --interval
    - {{ $.Values.probe.interval }}
    - --proc-root
    - /host/proc
    {{- if $podResources }}
    - --pod-resources
    - {{ $.Values.podResourcesDir }}/kubelet.sock
    {{- else }}
    - --no-pod-resources
    {{- end }}
    {{- if eq $.Values.probe.vendor "gaudi" }}
    - --sys-root
    - /host/sys
    {{- end }}
    {{- if $.Values.probe.engines.discovery }}
    - --cgroup-root
    - /host/sys/fs/cgroup
    {{- else }}
    - --no-engine-discovery
    {{- end }}
    {{- range $.Values.probe.engines.endpoints }}
    - --engine
    - {{ . | quote }}
    {{- end }}
    {{- with $.Values.probe.extraArgs }}
    {{- toYaml . | nindent 4 }}
    {{- end }}
  env:
    - name: NODE_NAME   # host.name on every resource (the probe reads $NODE_NAME)
      valueFrom:
        fieldRef:
          fieldPath: spec.nodeName
    {{- with $vendor.env }}
    {{- toYaml . | nindent 4 }}
    {{- end }}
    {{- with $.Values.probe.extraEnv }}
    {{- toYaml . | nindent 4 }}
    {{- end }}
  resources:
    {{- toYaml $.Values.probe.resources | nindent 4 }}
  securityContext:
    {{- $discovery := and $.Values.probe.engines.discovery true }}
    {{- if $discovery }}
    # Engine discovery adds SYS_PTRACE (the sockets of other users' processes, their
    # /proc/<pid>/fd) and SYS_ADMIN (setns(2) into a pod's network namespace), as root;
    # probe.engines.discovery=false drops both.
    {{- end }}
    {{- include "gputally.securityContext" (list (or $podResources $discovery) (ternary (list "SYS_ADMIN" "SYS_PTRACE") (list) $discovery)) | nindent 4 }}
  volumeMounts:
    - name: host-proc   # cgroup hints of GPU processes (/host/proc/<pid>/cgroup)
      mountPath: /host/proc
      readOnly: true
    {{- if $.Values.probe.engines.discovery }}
    - name: host-cgroup   # the processes of a GPU process's container (engine discovery)
      mountPath: /host/sys/fs/cgroup
      readOnly: true
    {{- end }}
    {{- if $podResources }}
    - name: pod-resources   # the directory, so a kubelet restart (new socket) is survived
      mountPath: {{ $.Values.podResourcesDir }}
      readOnly: true
    {{- end }}
    {{- if eq $.Values.probe.vendor "gaudi" }}
    - name: host-sys   # the Gaudi NIC ports' netdev counters
      mountPath: /host/sys
      readOnly: true
    {{- end }}
    {{- range $vendor.devices }}
    - name: {{ .name }}
      mountPath: {{ .path }}
      readOnly: true
    {{- end }}
    - name: probe-tmp
      mountPath: /tmp
{{- end -}}

{{/* The volumes the probe container mounts (host-proc, pod-resources, devices, its /tmp). */}}
{{- define "gputally.probeVolumes" -}}
{{- $ := index . 0 -}}
{{- $podResources := index . 1 -}}
{{- $vendor := include "gputally.vendor" $ | fromYaml -}}
- name: host-proc
  hostPath:
    path: /proc
    type: Directory
{{- if $.Values.probe.engines.discovery }}
- name: host-cgroup
  hostPath:
    path: /sys/fs/cgroup
    type: Directory
{{- end }}
{{- if eq $.Values.probe.vendor "gaudi" }}
- name: host-sys
  hostPath:
    path: /sys
    type: Directory
{{- end }}
{{- range $vendor.devices }}
- name: {{ .name }}
  hostPath:
    path: {{ .path }}
    type: {{ .type }}
{{- end }}
- name: probe-tmp   # the root filesystem is read-only
  emptyDir:
    sizeLimit: 64Mi
{{- end -}}

{{- define "gputally.podResourcesVolume" -}}
- name: pod-resources
  hostPath:
    path: {{ .Values.podResourcesDir }}
    type: Directory
{{- end -}}
