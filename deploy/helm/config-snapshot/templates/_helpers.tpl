{{/*
The name of every object: the release's name when it holds the chart's
(`helm install config-snapshot ...` names them config-snapshot, as
deploy/serve does), else <release>-config-snapshot.
*/}}
{{- define "config-snapshot.fullname" -}}
{{- if contains .Chart.Name .Release.Name -}}
{{- .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name .Chart.Name | trunc 63 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}

{{/*
Every object's labels, and every selector: the release's name as
`instance`, so that two releases never select each other's pods (fixed
at install: a Deployment's selector cannot change).
*/}}
{{- define "config-snapshot.labels" -}}
app.kubernetes.io/name: config-snapshot
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}

{{/* The namespaces serve never acts in beyond its own (--exclude-namespaces). */}}
{{- define "config-snapshot.excluded" -}}
{{- toJson (concat (list "kube-system" "kube-public" "kube-node-lease") .Values.excludeNamespaces) -}}
{{- end -}}

{{/* How the webhook's certificate is made: own, cert-manager or secret. */}}
{{- define "config-snapshot.certificates" -}}
{{- if .Values.certificate.certManager -}}
cert-manager
{{- else if .Values.certificate.secretName -}}
secret
{{- else -}}
own
{{- end -}}
{{- end -}}

{{/* The Secret serve reads its certificate from, unless it makes its own. */}}
{{- define "config-snapshot.tlsSecret" -}}
{{- if .Values.certificate.secretName -}}
{{ .Values.certificate.secretName }}
{{- else -}}
{{ include "config-snapshot.fullname" . }}-webhook-tls
{{- end -}}
{{- end -}}

{{/* serve's service account, as the API server names it in a request. */}}
{{- define "config-snapshot.username" -}}
system:serviceaccount:{{ .Release.Namespace }}:{{ include "config-snapshot.fullname" . }}
{{- end -}}

{{/*
What serve may do in a namespace it acts in: the ClusterRole's rules, or
each Role's in a namespaced install (host/tests/deploy.rs checks them
against what serve calls).
*/}}
{{- define "config-snapshot.rules" -}}
# Sources, read: the watch caches.
- apiGroups: [""]
  resources: ["configmaps", "secrets"]
  verbs: ["get", "list", "watch"]
# Snapshots, written. RBAC can name neither them nor the namespaces
# serve serves: identityguard.yaml narrows these to serve's own
# snapshots there.
- apiGroups: [""]
  resources: ["configmaps", "secrets"]
  verbs: ["create", "delete", "patch"]
- apiGroups: [""]
  resources: ["pods"]
  verbs: ["get", "list", "watch"]
# Its own Namespace, read (uid only) to anchor a shared snapshot in it
# (docs/design.md, "Garbage collection", Anchors). In a Role, it reads that namespace only.
- apiGroups: [""]
  resources: ["namespaces"]
  verbs: ["get"]
- apiGroups: ["apps"]
  resources: ["deployments", "statefulsets", "daemonsets"]
  verbs: ["get", "list", "watch", "patch"]
- apiGroups: ["apps"]
  resources: ["replicasets", "controllerrevisions"]
  verbs: ["get", "list", "watch"]
- apiGroups: ["batch"]
  resources: ["cronjobs"]
  verbs: ["get", "list", "watch", "patch"]
- apiGroups: ["batch"]
  resources: ["jobs"]
  verbs: ["get", "list", "watch"]
# Argo Rollouts, where its CRD is installed (optional).
- apiGroups: ["argoproj.io"]
  resources: ["rollouts"]
  verbs: ["get", "list", "watch", "patch"]
- apiGroups: ["events.k8s.io"]
  resources: ["events"]
  verbs: ["create", "patch"]
{{- end -}}

{{/* The signing key's guard (templates/keyguard.yaml), read by name. */}}
{{- define "config-snapshot.guard" -}}
{{ include "config-snapshot.fullname" . }}-signing-key
{{- end -}}

{{- define "config-snapshot.guard-rule" -}}
# The signing key's guard (keyguard.yaml): read, to know it is in force.
- apiGroups: ["admissionregistration.k8s.io"]
  resources: ["validatingadmissionpolicies", "validatingadmissionpolicybindings"]
  resourceNames: [{{ include "config-snapshot.guard" . | quote }}]
  verbs: ["get"]
# Its webhook configuration: kept calling the door's path.
- apiGroups: ["admissionregistration.k8s.io"]
  resources: ["mutatingwebhookconfigurations"]
  resourceNames: [{{ include "config-snapshot.fullname" . | quote }}]
  verbs: ["get", "patch"]
{{- end -}}
