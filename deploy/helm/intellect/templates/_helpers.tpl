{{/*
Shared pieces of the Intellect chart. Every secret reaches a pod as a Secret volume (or, where the
program reads nothing else, a secretKeyRef); no template here ever writes a secret value.
*/}}

{{- define "intellect.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{- define "intellect.fullname" -}}
{{- if .Values.fullnameOverride -}}
{{- .Values.fullnameOverride | trunc 63 | trimSuffix "-" -}}
{{- else if contains (include "intellect.name" .) .Release.Name -}}
{{- .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name (include "intellect.name" .) | trunc 63 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}

{{/* "<fullname>-<component>": the name of a component's objects and of its Service. */}}
{{- define "intellect.component" -}}
{{- printf "%s-%s" (include "intellect.fullname" .root) .name | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{- define "intellect.selectorLabels" -}}
app.kubernetes.io/name: {{ include "intellect.name" .root }}
app.kubernetes.io/instance: {{ .root.Release.Name }}
app.kubernetes.io/component: {{ .name }}
{{- end -}}

{{- define "intellect.labels" -}}
{{ include "intellect.selectorLabels" . }}
app.kubernetes.io/part-of: intellect
app.kubernetes.io/managed-by: {{ .root.Release.Service }}
app.kubernetes.io/version: {{ .root.Chart.AppVersion | quote }}
helm.sh/chart: {{ printf "%s-%s" .root.Chart.Name .root.Chart.Version | replace "+" "_" }}
{{- end -}}

{{/* The pods' service account: a token is never mounted (no pod talks to the Kubernetes API). */}}
{{- define "intellect.serviceAccountName" -}}
{{- if .Values.serviceAccount.create -}}
{{- default (include "intellect.fullname" .) .Values.serviceAccount.name -}}
{{- else -}}
{{- required "serviceAccount.name is required when serviceAccount.create is false" .Values.serviceAccount.name -}}
{{- end -}}
{{- end -}}

{{/*
An image reference from {registry, repository, tag, digest}: the digest wins over the tag.
Call with (dict "root" $ "image" .Values.images.service).
*/}}
{{- define "intellect.image" -}}
{{- $img := .image -}}
{{- $repo := $img.repository -}}
{{- $registry := default .root.Values.images.registry $img.registry -}}
{{- if $registry -}}{{- $repo = printf "%s/%s" (trimSuffix "/" $registry) $repo -}}{{- end -}}
{{- if $img.digest -}}
{{- printf "%s@%s" $repo $img.digest -}}
{{- else -}}
{{- printf "%s:%s" $repo (required (printf "a tag or a digest is required for image %s" $img.repository) $img.tag) -}}
{{- end -}}
{{- end -}}

{{/*
The `annotations:` of one workload object (nothing when it has none): checkov skips, each with its reason, for what the values chose
(an image by tag rather than digest, and the object's own documented exceptions in .skips), and the
object's extra annotations. Call with (dict "root" $ "images" (list img...) "skips" (list "ID=reason"...)
"chain" BOOL "redis" BOOL "envSecrets" (list "why"...)): chain/redis say the object reads the RPC URL /
the Redis URL, whose secrets can only be environment variables; a reason may not contain "=".
*/}}
{{- define "intellect.annotations" -}}
{{- $skips := list -}}
{{- $byTag := false -}}
{{- $latest := false -}}
{{- range .images -}}
{{- if not .digest -}}{{- $byTag = true -}}{{- if eq (toString .tag) "latest" -}}{{- $latest = true -}}{{- end -}}{{- end -}}
{{- end -}}
{{- if $byTag -}}
{{- $skips = append $skips "CKV_K8S_43=an image by tag because these values set no digest (a trial: `make images` builds have none until pushed); production values pin every image by digest (ci/production-values.yaml)" -}}
{{- if ne .root.Values.images.pullPolicy "Always" -}}
{{- $skips = append $skips "CKV_K8S_15=a trial may load `make images` builds straight onto its nodes with no registry to pull from: IfNotPresent; production pins digests and pulls Always" -}}
{{- end -}}
{{- end -}}
{{- if $latest -}}
{{- $skips = append $skips "CKV_K8S_14=tag latest is what `make images` tags for a trial; production pins digests" -}}
{{- end -}}
{{- $env := list -}}
{{- range .envSecrets -}}{{- $env = append $env . -}}{{- end -}}
{{- if and .chain .root.Values.chain.rpcUrlSecret.name -}}
{{- $env = append $env "the chain RPC URL, which carries an API key, is a plain setting (INTELLECT_*_RPC_URL)" -}}
{{- end -}}
{{- if and .redis (not .root.Values.trial.redis.enabled) .root.Values.redis.passwordSecret.name -}}
{{- $env = append $env "redis-py takes the Redis password only inside the URL: $(REDIS_PASSWORD) expanded into it" -}}
{{- end -}}
{{- if $env -}}
{{- $skips = append $skips (printf "CKV_K8S_35=a secretKeyRef only where the program reads the secret from nothing but its environment: %s; every other secret is a 0400 file" (join "; " $env)) -}}
{{- end -}}
{{- range .skips -}}{{- $skips = append $skips . -}}{{- end -}}
{{- if $skips }}
annotations:
{{- range $i, $skip := $skips }}
  checkov.io/skip{{ add1 $i }}: {{ $skip | quote }}
{{- end }}
{{- end }}
{{- end -}}

{{/* Pod-level security for every non-root pod of the chart. */}}
{{- define "intellect.podSecurityContext" -}}
runAsNonRoot: true
runAsUser: {{ .Values.securityContext.uid }}
runAsGroup: {{ .Values.securityContext.gid }}
fsGroup: {{ .Values.securityContext.gid }}
fsGroupChangePolicy: OnRootMismatch
seccompProfile:
  type: RuntimeDefault
{{- end -}}

{{/* Container-level security: non-root, no privilege escalation, no capabilities, read-only root. */}}
{{- define "intellect.containerSecurityContext" -}}
runAsNonRoot: true
runAsUser: {{ .Values.securityContext.uid }}
runAsGroup: {{ .Values.securityContext.gid }}
allowPrivilegeEscalation: false
readOnlyRootFilesystem: true
privileged: false
capabilities:
  drop: ["ALL"]
seccompProfile:
  type: RuntimeDefault
{{- end -}}

{{/*
Probes on a service's GET /health (every Intellect service has one). The start-up probe gives the
slow starters (torch imports, Alembic migrations, the trainer's model) 150 s; liveness restarts
only after a minute of failures, so a dependency's short outage (Redis) does not restart the pod.
Call with (dict "port" "http" "path" "/health").
*/}}
{{- define "intellect.httpProbes" -}}
{{- $path := default "/health" .path -}}
startupProbe:
  httpGet: {path: {{ $path }}, port: {{ .port }}}
  periodSeconds: 5
  timeoutSeconds: 5
  failureThreshold: 30
readinessProbe:
  httpGet: {path: {{ $path }}, port: {{ .port }}}
  periodSeconds: 5
  timeoutSeconds: 5
  failureThreshold: 3
livenessProbe:
  httpGet: {path: {{ $path }}, port: {{ .port }}}
  periodSeconds: 10
  timeoutSeconds: 5
  failureThreshold: 6
{{- end -}}

{{/* TCP probes, for the trial's third-party servers (Redis, PostgreSQL, S3). */}}
{{- define "intellect.tcpProbes" -}}
startupProbe:
  tcpSocket: {port: {{ .port }}}
  periodSeconds: 5
  failureThreshold: 30
readinessProbe:
  tcpSocket: {port: {{ .port }}}
  periodSeconds: 5
  failureThreshold: 3
livenessProbe:
  tcpSocket: {port: {{ .port }}}
  periodSeconds: 10
  failureThreshold: 6
{{- end -}}

{{- define "intellect.deploymentConfigMap" -}}
{{- default (printf "%s-deployment" (include "intellect.fullname" .)) .Values.chain.deploymentConfigMap -}}
{{- end -}}

{{/* The chain: RPC URL (from a Secret when it carries an API key) and the deployment file. */}}
{{- define "intellect.chainEnv" -}}
- name: {{ .prefix }}RPC_URL
{{- if .root.Values.chain.rpcUrlSecret.name }}
  valueFrom:
    secretKeyRef: {name: {{ .root.Values.chain.rpcUrlSecret.name }}, key: {{ .root.Values.chain.rpcUrlSecret.key }}}
{{- else }}
  value: {{ required "chain.rpcUrl (or chain.rpcUrlSecret.name) is required" .root.Values.chain.rpcUrl | quote }}
{{- end }}
- name: {{ .prefix }}DEPLOYMENT
  value: /etc/intellect/deployment.json
{{- end -}}

{{/* Writable scratch for every container (HOME and TMPDIR: torch, transformers, Python caches). */}}
{{- define "intellect.baseEnv" -}}
- name: HOME
  value: /tmp
- name: TMPDIR
  value: /tmp
- name: INTELLECT_LOG_FORMAT
  value: json
{{- end -}}

{{- define "intellect.deploymentVolume" -}}
- name: deployment
  configMap:
    name: {{ include "intellect.deploymentConfigMap" . }}
    items: [{key: deployment.json, path: deployment.json}]
{{- end -}}

{{/*
The "keys" init container. Kubernetes writes Secret files group-readable (0440) for a non-root pod,
and the services refuse a key file others can read (intellect/keyfiles.py), so this copies each
secret into a memory-backed folder as 0400 files owned by the pod's user, building the few files a
client wants in its own format (libpq's .pgpass, boto's credentials, SeaweedFS's identities).
Call with (dict "root" $ "specs" (list "copy:SRC:DST" ...)).
*/}}
{{- define "intellect.keysInit" -}}
- name: keys
  image: {{ include "intellect.image" (dict "root" .root "image" .root.Values.images.service) }}
  imagePullPolicy: {{ .root.Values.images.pullPolicy }}
  command: ["python3", "/etc/intellect/scripts/keys.py"]
  args:
{{- range .specs }}
    - {{ . | quote }}
{{- end }}
  securityContext:
{{ include "intellect.containerSecurityContext" .root | indent 4 }}
  resources:
    requests: {cpu: 10m, memory: 32Mi}
    limits: {cpu: 200m, memory: 64Mi}
  volumeMounts:
    - {name: keys, mountPath: /run/keys}
    - {name: secrets, mountPath: /run/secrets-in, readOnly: true}
    - {name: scripts, mountPath: /etc/intellect/scripts, readOnly: true}
{{- end -}}

{{/* Volumes every non-root pod of the chart has: scratch, the keys folder (memory) and the scripts. */}}
{{- define "intellect.commonVolumes" -}}
- name: tmp
  emptyDir: {sizeLimit: 1Gi}
- name: keys
  emptyDir: {medium: Memory, sizeLimit: 4Mi}
- name: scripts
  configMap:
    name: {{ include "intellect.component" (dict "root" . "name" "scripts") }}
    defaultMode: 0444
{{- end -}}

{{/*
A projected volume of the Secrets a pod needs, each at /run/secrets-in/<path>.
Call with (dict "items" (list (dict "secret" NAME "key" KEY "path" PATH) ...)).
*/}}
{{- define "intellect.secretsVolume" -}}
- name: secrets
  projected:
    defaultMode: 0440
    sources:
{{- range .items }}
      - secret:
          name: {{ .secret }}
          items: [{key: {{ .key }}, path: {{ .path }}}]
{{- end }}
{{- end -}}

{{- define "intellect.scheduling" -}}
{{- with .nodeSelector }}
nodeSelector:
{{ toYaml . | indent 2 }}
{{- end }}
{{- with .tolerations }}
tolerations:
{{ toYaml . | indent 2 }}
{{- end }}
{{- with .affinity }}
affinity:
{{ toYaml . | indent 2 }}
{{- end }}
{{- end -}}

{{- define "intellect.pullSecrets" -}}
{{- with .Values.images.pullSecrets }}
imagePullSecrets:
{{- range . }}
  - name: {{ . }}
{{- end }}
{{- end }}
{{- end -}}

{{/* In-cluster endpoints of the pool's own services. */}}
{{- define "intellect.url" -}}
{{- printf "http://%s:%v" (include "intellect.component" (dict "root" .root "name" .name)) .port -}}
{{- end -}}

{{- define "intellect.redisUrl" -}}
{{- if .Values.trial.redis.enabled -}}
{{- printf "redis://%s:6379/0" (include "intellect.component" (dict "root" . "name" "redis")) -}}
{{- else if .Values.redis.passwordSecret.name -}}
{{- $u := required "redis.url is required without trial.redis" .Values.redis.url -}}
{{- $parts := splitList "://" $u -}}
{{- printf "%s://:$(REDIS_PASSWORD)@%s" (first $parts) (last $parts) -}}
{{- else -}}
{{- required "redis.url is required without trial.redis" .Values.redis.url -}}
{{- end -}}
{{- end -}}

{{- define "intellect.redisPasswordEnv" -}}
{{- if and (not .Values.trial.redis.enabled) .Values.redis.passwordSecret.name }}
- name: REDIS_PASSWORD
  valueFrom:
    secretKeyRef: {name: {{ .Values.redis.passwordSecret.name }}, key: {{ .Values.redis.passwordSecret.key }}}
{{- end }}
{{- end -}}

{{- define "intellect.postgresHost" -}}
{{- if .Values.trial.postgres.enabled -}}
{{- include "intellect.component" (dict "root" . "name" "postgres") -}}
{{- else -}}
{{- required "postgres.host is required without trial.postgres" .Values.postgres.host -}}
{{- end -}}
{{- end -}}

{{- define "intellect.postgresSecret" -}}
{{- default (printf "%s-postgres" (include "intellect.fullname" .)) .Values.postgres.passwordSecret.name -}}
{{- end -}}

{{- define "intellect.s3Secret" -}}
{{- default (printf "%s-s3" (include "intellect.fullname" .)) .Values.s3.credentialsSecret.name -}}
{{- end -}}

{{- define "intellect.s3Endpoint" -}}
{{- if .Values.s3.endpointUrl -}}
{{- .Values.s3.endpointUrl -}}
{{- else if .Values.trial.s3.enabled -}}
{{- include "intellect.url" (dict "root" . "name" "s3" "port" 8333) -}}
{{- end -}}
{{- end -}}

{{- define "intellect.orchestratorSecret" -}}
{{- default (printf "%s-orchestrator" (include "intellect.fullname" .)) .Values.orchestrator.secret.name -}}
{{- end -}}

{{- define "intellect.validatorSecret" -}}
{{- printf "%s%d" (default (printf "%s-validator-" (include "intellect.fullname" .root)) .root.Values.validators.keySecretPrefix) (int .index) -}}
{{- end -}}
