#!/usr/bin/env bash
# Tests deploy/k8s/check.py: the base passes, and each broken copy of it fails
# with the rule's message; and the certificates, tokens and Secrets that
# deploy/make-certs.sh and make-secrets.sh make. Prints "check_test: N passed,
# M failed".
set -uo pipefail
cd "$(dirname "$0")" || exit 1
PY=/usr/bin/python3
TMP=$(mktemp -d "${TMPDIR:-/tmp}/tessera-k8s-check.XXXXXX")
trap 'rm -rf "$TMP"' EXIT
passed=0
failed=0

# A verdict is counted here, or (a broken case running in the background)
# tallied in its file $TALLY.
ok() {
  echo "  ok   $*"
  passed=$((passed + 1))
  if [ -n "${TALLY:-}" ]; then echo ok >>"$TALLY"; fi
}
bad() {
  echo "  FAIL $*"
  failed=$((failed + 1))
  if [ -n "${TALLY:-}" ]; then echo fail >>"$TALLY"; fi
}

# Runs check.py on the base and the example Secrets as they are.
for renderer in auto builtin; do
  if out=$($PY check.py --renderer=$renderer . secrets.example.yaml 2>&1); then
    ok "the base passes ($renderer renderer)"
  else
    bad "the base fails ($renderer renderer): $out"
  fi
done

# broken NAME FILE "OLD|||NEW" EXPECTED
#   copies the base (with its components), replaces the first OLD by NEW in
#   FILE, and expects check.py to fail with a message containing EXPECTED
#   with each renderer (checked by collect_broken).
CASES="$TMP/cases.tsv"
: >"$CASES"
broken() {
  local name="$1" file="$2" edit="$3" expected="$4" dir="$TMP/$1"
  mkdir -p "$dir"
  cp ./*.yaml "$dir/"
  cp -r components "$dir/"
  if ! $PY - "$dir/$file" "$edit" <<'PYEOF'
import sys
path, edit = sys.argv[1], sys.argv[2]
old, new = edit.split("|||")
text = open(path).read()
if old not in text:
    sys.exit(f"the text to break is not in {path}: {old!r}")
open(path, "w").write(text.replace(old, new, 1))
PYEOF
  then
    bad "$name: could not break the manifest (the base changed?)"
    return
  fi
  printf '%s\t%s\t%s\n' "$name" "$dir" "$expected" >>"$CASES"
}

# Every case, once per renderer: one process each (check_cases.py), the two
# at once; their verdicts printed and counted in order.
collect_broken() {
  local renderer line
  for renderer in auto builtin; do
    $PY check_cases.py --renderer=$renderer "$CASES" >"$TMP/verdicts.$renderer" 2>&1 &
  done
  wait
  for renderer in auto builtin; do
    while IFS= read -r line; do
      case "$line" in
        "ok "*) ok "${line#ok }" ;;
        "FAIL "*) bad "${line#FAIL }" ;;
        *) bad "check_cases.py ($renderer): $line" ;;
      esac
    done <"$TMP/verdicts.$renderer"
  done
}

broken no-readiness-probe worker.yaml \
  '          readinessProbe:|||          x-readinessProbe:' 'no readinessProbe'
broken no-memory-limit coordinator.yaml \
  'limits: {cpu: "2", memory: 4Gi}|||limits: {cpu: "2"}' 'no resources.limits.memory'
broken secret-in-env worker.yaml \
  '            - name: POD_NAME|||            - name: WORKER_SECRET
              value: placeholder-worker-secret
            - name: POD_NAME' "holds a Secret's value in plain text"
broken secret-key-ref worker.yaml \
  '            - name: POD_NAME|||            - name: T
              valueFrom: {secretKeyRef: {name: tessera-worker-token, key: token}}
            - name: POD_NAME' 'mount Secrets as files'
broken runs-as-root coordinator.yaml \
  '        runAsNonRoot: true|||        runAsNonRoot: false' 'runAsNonRoot'
broken writable-root worker.yaml \
  'readOnlyRootFilesystem: true|||readOnlyRootFilesystem: false' 'readOnlyRootFilesystem'
# shellcheck disable=SC1003  # the backslashes are the text to find
broken insecure coordinator.yaml \
  '--listen=0.0.0.0:7070 \|||--listen=0.0.0.0:7070 --insecure \' '--insecure'
broken tcp-liveness worker.yaml \
  '            grpc: {port: 8071, service: liveness}
            periodSeconds: 20|||            tcpSocket: {port: 7071}
            periodSeconds: 20' 'livenessProbe is a TCP probe'
broken metrics-open-to-all networkpolicy.yaml \
  '    - from:
        - namespaceSelector:
            matchLabels: {kubernetes.io/metadata.name: monitoring}
          podSelector:
            matchLabels: {app.kubernetes.io/name: prometheus}
      ports:|||    - ports:' 'admits every peer to the metrics port'
broken no-network-policy kustomization.yaml \
  '  - networkpolicy.yaml|||' 'is open to every pod'
broken unknown-field worker.yaml \
  'podManagementPolicy: Parallel|||podManagementPolicy: Parallel
  replica: 3' 'unknown field'
broken wrong-type coordinator.yaml \
  'prometheus.io/port: "9090"|||prometheus.io/port: 9090' 'expected a string'
broken grpc-probe-without-port worker.yaml \
  'grpc: {port: 8071, service: liveness}|||grpc: {service: liveness}' 'required field missing'
broken grpc-probe-under-tls coordinator.yaml \
  'grpc: {port: 8070, service: liveness}|||grpc: {port: 7070, service: liveness}' 'cannot pass against mutual TLS'
# shellcheck disable=SC1003
broken grpc-probe-without-health-port worker.yaml \
  '--health_listen=0.0.0.0:8071 \|||\' 'probe the --health_listen port'
# shellcheck disable=SC1003  # the backslashes are the text to find
broken tls-without-tokens coordinator.yaml \
  '--tokens=/run/tessera/tokens \|||\' 'no --tokens'
# shellcheck disable=SC1003
broken tls-without-key worker.yaml \
  '--tls_key=/etc/tessera/tls/tls.key \|||\' 'no --tls_key'
# shellcheck disable=SC2016  # $(...) is Kubernetes' syntax, not the shell's
broken advertises-pod-ip worker.yaml \
  '              value: "$(POD_NAME).tessera-worker.$(POD_NAMESPACE).svc.cluster.local:7071"|||              valueFrom: {fieldRef: {fieldPath: status.podIP}}' 'advertises its pod IP'
broken missing-service worker.yaml \
  'serviceName: tessera-worker|||serviceName: tessera-workers' 'is not a Service'
# The workers' zone and preStop drain ($(...) and $VAR: the pod's shell's).
# shellcheck disable=SC1003,SC2016
broken no-zone worker.yaml \
  '                --zone="$(cat /run/tessera/zone)" \
|||' 'no --zone'
# shellcheck disable=SC2016
broken bad-zone worker.yaml \
  '--zone="$(cat /run/tessera/zone)"|||--zone=eu-west-1a@2' 'is not a zone'
broken zone-not-written worker.yaml \
  '- {name: run, mountPath: /run/tessera}|||- {name: run, mountPath: /run/tessera, readOnly: true}' \
  'which no initContainer writes'
# shellcheck disable=SC2016
broken no-prestop-drain worker.yaml \
  'admin worker drain "$POD_NAME"|||admin worker cordon "$POD_NAME"' 'no preStop hook that drains it'
# shellcheck disable=SC2016
broken drains-another-worker worker.yaml \
  'admin worker drain "$POD_NAME"|||admin worker drain "$HOSTNAME"' "not this worker's --name"
# shellcheck disable=SC2016
broken drain-without-token worker.yaml \
  '                        --tls_key=/etc/tessera/tls/tls.key --token_file=/etc/tessera/drain/token "$@"|||                        --tls_key=/etc/tessera/tls/tls.key "$@"' \
  'the preStop drain has no --token_file'
broken drain-unbounded worker.yaml \
  'drain_limit=540|||limit=540' 'the preStop drain has no bound'
broken grace-below-drain worker.yaml \
  'terminationGracePeriodSeconds: 600|||terminationGracePeriodSeconds: 300' 'kills the worker mid-drain'
# RBAC: the zone initContainer's ServiceAccount, ClusterRole and binding.
broken missing-service-account worker.yaml \
  'serviceAccountName: tessera-worker|||serviceAccountName: tessera-workers' 'is not a ServiceAccount in the manifests'
broken binding-to-missing-role worker.yaml \
  '  name: tessera-worker-nodes
subjects:|||  name: tessera-nodes
subjects:' 'roleRef ClusterRole/tessera-nodes is not a ClusterRole'
broken binding-to-missing-account worker.yaml \
  '{kind: ServiceAccount, name: tessera-worker, namespace: default}|||{kind: ServiceAccount, name: tessera, namespace: default}' \
  "subject ServiceAccount 'tessera' is not a ServiceAccount"
broken subject-without-namespace worker.yaml \
  '{kind: ServiceAccount, name: tessera-worker, namespace: default}|||{kind: ServiceAccount, name: tessera-worker}' \
  'has no namespace'
broken role-wildcard worker.yaml \
  '    verbs: [get]|||    verbs: ["*"]' "grants '*' in verbs"
broken worker-automounts-token worker.yaml \
  'automountServiceAccountToken: false|||automountServiceAccountToken: true' 'can reach the Kubernetes API'
broken worker-mounts-token worker.yaml \
  '            - {name: run, mountPath: /run/tessera, readOnly: true}|||            - {name: run, mountPath: /run/tessera, readOnly: true}
            - {name: kube-api, mountPath: /var/run/secrets/kubernetes.io/serviceaccount, readOnly: true}' \
  'it mounts a ServiceAccount token (volume kube-api)'

# The workers' data port (README.md "TCP data ports"): declared, on the
# Service, advertised at its port and the gRPC name, admitted as gRPC is.
broken data-port-undeclared worker.yaml '            - {name: data, containerPort: 7072}
|||' '--data_listen port 7072 is not a containerPort'
broken data-port-off-service worker.yaml '    - {name: data, port: 7072, targetPort: data}    # bulk bytes over TCP
|||' '--data_listen port 7072 is on no port of Service tessera-worker'
# shellcheck disable=SC1003  # the backslash is the text to find
broken no-data-listen worker.yaml '                --data_listen=0.0.0.0:7072 \
|||' 'tessera-worker has no --data_listen'
broken data-advertise-port worker.yaml 'svc.cluster.local:7072"|||svc.cluster.local:7073"' \
  "--data_advertise port 7073 is not --data_listen's port 7072"
# shellcheck disable=SC2016  # $(...) is Kubernetes' syntax, not the shell's
broken data-advertise-other-name worker.yaml \
  '"$(POD_NAME).tessera-worker.$(POD_NAMESPACE).svc.cluster.local:7072"|||"$(POD_NAME).tessera-data.$(POD_NAMESPACE).svc.cluster.local:7072"' \
  'is not its --advertise host'
# shellcheck disable=SC2016
broken data-advertises-pod-ip worker.yaml \
  '              value: "$(POD_NAME).tessera-worker.$(POD_NAMESPACE).svc.cluster.local:7072"|||              valueFrom: {fieldRef: {fieldPath: status.podIP}}' \
  'advertises its pod IP under TLS (--data_advertise)'
broken data-port-closed networkpolicy.yaml '        - {protocol: TCP, port: data}
|||' 'admit the data port 7072 from other peers than the gRPC port 7071'
broken data-port-workers-only networkpolicy.yaml '        - {protocol: TCP, port: data}
        - {protocol: TCP, port: health}
|||        - {protocol: TCP, port: health}
    - from:
        - podSelector:
            matchLabels: {app.kubernetes.io/name: tessera, app.kubernetes.io/component: worker}
      ports:
        - {protocol: TCP, port: data}
' 'admit the data port 7072 from other peers than the gRPC port 7071'

# The highly available coordinator: etcd, coordinators on it, workers
# naming every coordinator.
broken etcd-two-members etcd.yaml '  replicas: 3|||  replicas: 2' 'etcd runs 2 member(s)'
broken etcd-data-off-pvc etcd.yaml '--data-dir=/var/lib/etcd/data|||--data-dir=/tmp/etcd' 'is not on a PersistentVolumeClaim'
broken etcd-ordered etcd.yaml '  podManagementPolicy: Parallel|||' 'podManagementPolicy: Parallel'
broken etcd-not-headless etcd.yaml '  clusterIP: None             # headless: a DNS name per member|||  type: ClusterIP' 'is not headless'
broken etcd-unpublished etcd.yaml '  publishNotReadyAddresses: true|||' 'has no publishNotReadyAddresses'
# shellcheck disable=SC2016  # $MEMBERS is the pod's shell's
broken etcd-initial-cluster etcd.yaml ',tessera-etcd-2=https://tessera-etcd-2.$MEMBERS:2380"|||"' 'does not name member tessera-etcd-2'
broken etcd-budget etcd.yaml 'spec:
  maxUnavailable: 1|||spec:
  maxUnavailable: 2' 'lets more than one etcd member go at once'
broken etcd-client-open networkpolicy.yaml '    - from:
        - podSelector:
            matchLabels: {app.kubernetes.io/name: tessera, app.kubernetes.io/component: coordinator}
        - podSelector:
            matchLabels: {app.kubernetes.io/name: tessera, app.kubernetes.io/component: etcd}
      ports:
        - {protocol: TCP, port: client}|||    - ports:
        - {protocol: TCP, port: client}' "admits every peer to etcd's client port"
broken etcd-coordinators-shut-out networkpolicy.yaml 'app.kubernetes.io/component: coordinator}|||app.kubernetes.io/component: worker}' \
  "no NetworkPolicy admits the coordinators to etcd's client port"
broken etcd-metrics-open networkpolicy.yaml '    - from:
        - namespaceSelector:
            matchLabels: {kubernetes.io/metadata.name: monitoring}
          podSelector:
            matchLabels: {app.kubernetes.io/name: prometheus}
      ports:|||    - ports:' 'admits every peer to the metrics port 2381'
# shellcheck disable=SC2016  # $(...) is Kubernetes' syntax, not the shell's
broken metadata-misses-member coordinator.yaml ',tessera-etcd-2.tessera-etcd.$(POD_NAMESPACE).svc.cluster.local:2379"|||"' \
  'does not name etcd member tessera-etcd-2'
# shellcheck disable=SC1003
broken metadata-and-data-dir coordinator.yaml '                --advertise="${ADVERTISE}" \|||                --advertise="${ADVERTISE}" \
                --data_dir=/var/lib/tessera/data \' 'both --metadata and --data_dir'
broken one-coordinator coordinator.yaml '  replicas: 2|||  replicas: 1' 'is not highly available'
broken coordinator-clusterip coordinator.yaml '  clusterIP: None|||  type: ClusterIP' 'is not headless'
broken fixed-advertise coordinator.yaml '--advertise="${ADVERTISE}"|||--advertise=tessera-coordinator:7070' "is not the pod's own name"
broken standby-restarted coordinator.yaml 'grpc: {service: liveness, port: 8070}|||grpc: {port: 8070}' 'the livenessProbe restarts it'
broken rolling-update coordinator.yaml 'updateStrategy: {type: OnDelete}|||updateStrategy: {type: RollingUpdate}' 'updateStrategy OnDelete'
broken coordinator-budget coordinator.yaml '# No PodDisruptionBudget: only|||---
apiVersion: policy/v1
kind: PodDisruptionBudget
metadata:
  name: tessera-coordinator
spec:
  maxUnavailable: 1
  selector:
    matchLabels: {app.kubernetes.io/name: tessera, app.kubernetes.io/component: coordinator}
# No PodDisruptionBudget: only' 'forbids evicting the leader'
broken worker-one-coordinator worker.yaml ',tessera-coordinator-1.tessera-coordinator.$(POD_NAMESPACE).svc.cluster.local:7070"|||"' \
  'does not name coordinator tessera-coordinator-1'
broken uncordon-one-coordinator worker.yaml 'timeout 30 tessera --coordinator="$COORDINATORS" \|||timeout 30 tessera --coordinator=tessera-coordinator-0.tessera-coordinator:7070 \' \
  'does not name coordinator tessera-coordinator-1'
# shellcheck disable=SC1003
broken worker-no-coordinator worker.yaml '                --coordinator="${COORDINATORS}" \
|||' 'tessera-worker has no --coordinator'

# etcd's own TLS (its prefix holds the cluster's secret): clients and peers
# over https with certificates of etcd's CA from a Secret, and coordinators
# that present theirs. ($MEMBERS and $POD_NAME are the pod's shell's.)
# shellcheck disable=SC2016
broken etcd-client-plaintext etcd.yaml '--listen-client-urls=https://|||--listen-client-urls=http://' \
  'etcd serves clients over plaintext (http://0.0.0.0:2379)'
# shellcheck disable=SC2016
broken etcd-advertises-plaintext etcd.yaml '--advertise-client-urls="https://|||--advertise-client-urls="http://' \
  'etcd serves clients over plaintext (http://$POD_NAME.'
broken etcd-peer-plaintext etcd.yaml '--listen-peer-urls=https://|||--listen-peer-urls=http://' \
  'etcd serves peers over plaintext (http://0.0.0.0:2380)'
broken etcd-initial-cluster-plaintext etcd.yaml 'tessera-etcd-1=https://|||tessera-etcd-1=http://' \
  'etcd serves peers over plaintext (http://tessera-etcd-1.'
# shellcheck disable=SC1003
broken etcd-no-client-cert-auth etcd.yaml '                --client-cert-auth \
|||' 'etcd without --client-cert-auth'
# shellcheck disable=SC1003
broken etcd-peer-cert-auth-off etcd.yaml '--peer-client-cert-auth \|||--peer-client-cert-auth=false \' \
  'etcd without --peer-client-cert-auth'
# shellcheck disable=SC1003
broken etcd-no-trusted-ca etcd.yaml '                --trusted-ca-file=/etc/etcd/tls/ca.crt \
|||' 'etcd has no --trusted-ca-file'
broken etcd-certs-not-a-secret etcd.yaml '          secret: {secretName: tessera-etcd-tls, defaultMode: 0440}|||          emptyDir: {}' \
  "etcd's --cert-file: /etc/etcd/tls/tls.crt is on volume 'tls', which is not a Secret"
broken etcd-certs-writable etcd.yaml '{name: tls, mountPath: /etc/etcd/tls, readOnly: true}|||{name: tls, mountPath: /etc/etcd/tls}' \
  "etcd's --peer-key-file: /etc/etcd/tls/tls.key is on volume 'tls', mounted writable"
broken etcd-secret-missing secrets.example.yaml '  name: tessera-etcd-tls|||  name: tessera-etcd-certs' \
  "comes from Secret 'tessera-etcd-tls', which is not among the Secrets checked"
broken etcd-liveness-on-client-port etcd.yaml 'httpGet: {path: /metrics, port: metrics}|||httpGet: {path: /version, port: client}' \
  "livenessProbe asks etcd's client port 2379"
# shellcheck disable=SC1003
broken coordinator-etcd-no-ca coordinator.yaml '                --etcd_ca=/etc/tessera/etcd-tls/ca.crt \
|||' 'the coordinator has no --etcd_ca'
# shellcheck disable=SC1003
broken coordinator-etcd-no-key coordinator.yaml '                --etcd_key=/etc/tessera/etcd-tls/tls.key \
|||' 'the coordinator has no --etcd_key'
broken coordinator-etcd-cert-unmounted coordinator.yaml '            - {name: etcd-tls, mountPath: /etc/tessera/etcd-tls, readOnly: true}
|||' '--etcd_cert: /etc/tessera/etcd-tls/tls.crt is on no volume the container mounts'
broken coordinator-etcd-cert-no-key coordinator.yaml '--etcd_cert=/etc/tessera/etcd-tls/tls.crt|||--etcd_cert=/etc/tessera/etcd-tls/client.crt' \
  "is key 'client.crt' of Secret 'tessera-coordinator-etcd-tls', which has no such key"
# shellcheck disable=SC2016
broken coordinator-tls-to-plaintext-etcd etcd.yaml '--listen-client-urls=https://0.0.0.0:2379 \
                --advertise-client-urls="https://|||--listen-client-urls=http://0.0.0.0:2379 \
                --advertise-client-urls="http://' '--etcd_ca speaks TLS to etcd, which serves plaintext'

# Images: every one named by an `images:` entry, so that `kustomize edit set
# image` and an overlay's `images:` change them all.
# shellcheck disable=SC2016  # the backquotes are the message's
broken image-not-in-images worker.yaml 'image: localhost/tessera:latest|||image: tessera:latest' \
  'image tessera:latest is covered by no `images:` entry'
# shellcheck disable=SC2016
broken images-entry-misnamed kustomization.yaml '  - name: localhost/tessera|||  - name: tessera' \
  'is covered by no `images:` entry of kustomization.yaml (none is named localhost/tessera)'
broken images-entry-stale kustomization.yaml 'images:
|||images:
  - {name: localhost/tessera-worker, newTag: latest}
' "entry 'localhost/tessera-worker' names no image"

# The optional ServiceMonitors (components/servicemonitor), checked on the
# base with the component: a Service they select, a metrics port of it.
SM=components/servicemonitor/servicemonitor.yaml
broken servicemonitor-selects-nothing $SM \
  '    matchLabels: {app.kubernetes.io/name: tessera, app.kubernetes.io/component: worker}|||    matchLabels: {app.kubernetes.io/name: tessera, app.kubernetes.io/component: workers}' \
  'ServiceMonitor/tessera-worker: selects no Service'
broken servicemonitor-port-unnamed $SM '{port: metrics, path: /metrics, interval: 30s}|||{port: prometheus, path: /metrics, interval: 30s}' \
  "port 'prometheus' is no port of Service tessera-coordinator"
broken service-without-metrics-port coordinator.yaml '    - {name: metrics, port: 9090, targetPort: metrics}
|||' "port 'metrics' is no port of Service tessera-coordinator"
broken servicemonitor-scrapes-grpc $SM '{port: metrics, path: /metrics, interval: 30s}|||{port: grpc, path: /metrics, interval: 30s}' \
  "port 'grpc' of Service tessera-coordinator leads to no metrics port"
broken servicemonitor-path $SM 'path: /metrics|||path: /stats' 'the daemons serve metrics at /metrics'
broken servicemonitor-unknown-field $SM 'interval: 30s}|||intervall: 30s}' 'intervall: unknown field'
broken servicemonitor-in-base kustomization.yaml '  - networkpolicy.yaml
|||  - networkpolicy.yaml
  - components/servicemonitor/servicemonitor.yaml
' 'applies only where the CRD of monitoring.coreos.com/v1 ServiceMonitor is installed'

# The optional DaemonSet of inference workers (components/inference-daemonset),
# checked on the base with the component: its nodes, its rollout, its
# workers' --labels, and the rules every workload keeps.
DS=components/inference-daemonset/daemonset.yaml
broken ds-every-node $DS '      nodeSelector:
        tessera.dev/inference: "true"
|||' 'without a nodeSelector or a required node affinity runs one on every node of the cluster'
broken ds-preferred-affinity-only $DS '      nodeSelector:
        tessera.dev/inference: "true"
|||      affinity:
        nodeAffinity:
          preferredDuringSchedulingIgnoredDuringExecution:
            - weight: 1
              preference:
                matchExpressions: [{key: tessera.dev/inference, operator: In, values: ["true"]}]
' 'without a nodeSelector or a required node affinity runs one on every node of the cluster'
broken ds-on-delete $DS '    type: RollingUpdate
    rollingUpdate: {maxUnavailable: 1}|||    type: OnDelete' 'updateStrategy OnDelete: a DaemonSet of tessera-worker is updated by RollingUpdate'
broken ds-max-unavailable $DS 'rollingUpdate: {maxUnavailable: 1}|||rollingUpdate: {maxUnavailable: "50%"}' \
  "rollingUpdate.maxUnavailable is '50%', not 1"
broken ds-max-unavailable-unsaid $DS '    rollingUpdate: {maxUnavailable: 1}
|||' 'has no rollingUpdate.maxUnavailable: a rollout replaces one node'
# shellcheck disable=SC2016  # $(...) is Kubernetes' syntax, not the shell's
broken ds-labels-twice $DS 'role=inference,node=$(NODE_NAME)|||role=inference,role=gpu,node=$(NODE_NAME)' \
  "label 'role' is given twice (the worker exits 2)"
# shellcheck disable=SC2016
broken ds-labels-not-a-pair $DS 'role=inference,node=$(NODE_NAME)|||inference,node=$(NODE_NAME)' \
  "'inference' is not KEY=VALUE"
# shellcheck disable=SC2016
broken ds-labels-bad-key $DS 'role=inference,node=$(NODE_NAME)|||-role=inference,node=$(NODE_NAME)' \
  "label key '-role' must be 1 to 63 of letters, digits, _ . - and / starting with a letter or digit"
# shellcheck disable=SC2016
broken ds-labels-bad-value $DS 'role=inference,node=$(NODE_NAME)|||role=gpu/a100,node=$(NODE_NAME)' \
  "the value of label 'role', 'gpu/a100', must be 0 to 63"
# shellcheck disable=SC2016
broken ds-labels-too-many $DS "role=inference,node=\$(NODE_NAME)|||$(printf 'k%d=v,' $(seq 1 32))node=\$(NODE_NAME)" \
  '33 labels (at most 32)'
# shellcheck disable=SC2016
broken ds-labels-undefined-var $DS 'role=inference,node=$(NODE_NAME)|||role=inference,node=$(NODE)' \
  '$(NODE) names no env var of the container'
broken ds-labels-literal-var $DS '{name: NODE_NAME, valueFrom: {fieldRef: {fieldPath: spec.nodeName}}}|||{name: NODE_NAME, value: "gpu node 1"}' \
  "the value of label 'node', 'gpu node 1', must be 0 to 63"
# shellcheck disable=SC2016  # the message quotes $(NODE_NAME)
broken ds-labels-var-from-configmap $DS '{name: NODE_NAME, valueFrom: {fieldRef: {fieldPath: spec.nodeName}}}|||{name: NODE_NAME, valueFrom: {configMapKeyRef: {name: nodes, key: name}}}' \
  '$(NODE_NAME) comes from neither a literal value nor the downward API'
# The rules every workload keeps, on the DaemonSet too.
broken ds-no-readiness-probe $DS '          readinessProbe:|||          x-readinessProbe:' \
  'DaemonSet/tessera-worker-inference container worker: no readinessProbe'
broken ds-no-memory-limit $DS 'limits: {cpu: "4", memory: 8Gi}|||limits: {cpu: "4"}' \
  'DaemonSet/tessera-worker-inference container worker: no resources.limits.memory'
broken ds-secret-key-ref $DS '            - {name: POD_IP, valueFrom|||            - {name: T, valueFrom: {secretKeyRef: {name: tessera-worker-token, key: token}}}
            - {name: POD_IP, valueFrom' 'DaemonSet/tessera-worker-inference container worker: env T comes from a Secret'
# shellcheck disable=SC2016
broken ds-no-prestop-drain $DS 'admin worker drain "$POD_NAME"|||admin worker cordon "$POD_NAME"' \
  'DaemonSet/tessera-worker-inference container worker: tessera-worker has no preStop hook that drains it'
# shellcheck disable=SC2016  # $(...) and $POD_IP are the pod's shell's
broken ds-advertises-pod-ip $DS "--advertise=\"\$(echo \$POD_IP | sed 's/[.:]/-/g').\${POD_NAMESPACE}.pod.cluster.local:7071\"|||--advertise=\"\${POD_IP}:7071\"" \
  'tessera-worker advertises its pod IP under TLS (--advertise)'
# shellcheck disable=SC2016
broken ds-a-record-with-dots $DS "--advertise=\"\$(echo \$POD_IP | sed 's/[.:]/-/g')|||--advertise=\"\$(echo \$POD_IP)" \
  'tessera-worker advertises its pod IP under TLS (--advertise)'
broken ds-selector-mismatch $DS '    matchLabels: {app.kubernetes.io/name: tessera, app.kubernetes.io/component: inference-worker}|||    matchLabels: {app.kubernetes.io/name: tessera, app.kubernetes.io/component: inference}' \
  "DaemonSet/tessera-worker-inference: spec.selector does not match the pod template's labels"
# shellcheck disable=SC2016  # the backquotes are the message's
broken ds-image-not-in-images $DS 'image: localhost/tessera:latest|||image: tessera:latest' \
  'image tessera:latest is covered by no `images:` entry (of the base or the component)'
# shellcheck disable=SC2016
broken ds-image-not-the-bases kustomization.yaml '    newTag: latest|||    newTag: v2' \
  "image localhost/tessera:latest is not the base's (localhost/tessera:v2): the base's \`images:\` entry renames only the base's own containers"

collect_broken

# A required node affinity selects the DaemonSet's nodes as a nodeSelector does.
affinity_check() {
  local d="$TMP/affinity" renderer out
  mkdir -p "$d"
  cp ./*.yaml "$d/"
  cp -r components "$d/"
  $PY - "$d/$DS" <<'PYEOF4'
import sys
path = sys.argv[1]
text = open(path).read()
old = '      nodeSelector:\n        tessera.dev/inference: "true"\n'
new = ('      affinity:\n        nodeAffinity:\n          requiredDuringSchedulingIgnoredDuringExecution:\n'
       '            nodeSelectorTerms:\n'
       '              - matchExpressions: [{key: tessera.dev/inference, operator: In, values: ["true"]}]\n')
assert old in text
open(path, "w").write(text.replace(old, new, 1))
PYEOF4
  for renderer in auto builtin; do
    if out=$($PY check.py --renderer=$renderer "$d" "$d/secrets.example.yaml" 2>&1); then
      ok "a DaemonSet with a required node affinity in place of its nodeSelector passes ($renderer)"
    else
      bad "a DaemonSet with a required node affinity fails ($renderer): $out"
    fi
  done
}
affinity_check

# A user's overlay: its `images:` renames every image (the inference
# DaemonSet's too, which the base's entry does not reach), and with the
# components the ServiceMonitors and the DaemonSet come along, and pass.
overlay_checks() {
  local d="$TMP/overlay" base renderer out got
  mkdir -p "$d"
  base=$(realpath --relative-to="$d" .)
  cat >"$d/kustomization.yaml" <<EOF
resources: [$base]
components: [$base/components/servicemonitor, $base/components/inference-daemonset]
images:
  - {name: localhost/tessera, newName: registry.example:5000/tessera, newTag: v1}
EOF
  for renderer in auto builtin; do
    if ! out=$($PY check.py --renderer=$renderer "$d" secrets.example.yaml 2>&1); then
      bad "an overlay with images: and both components fails ($renderer): $out"
      continue
    fi
    got=$($PY - "$d" "$renderer" <<'PYEOF3'
import shutil, sys
import check
d, renderer = sys.argv[1], sys.argv[2]
kubectl = renderer == "auto" and shutil.which("kubectl")
docs = check.render_kubectl(d) if kubectl else check.render_builtin(d)
print(" ".join(sorted({c.get("image") for o in docs for c in check.containers_of(o)})),
      sum(o.get("kind") == "ServiceMonitor" for o in docs),
      sum(o.get("kind") == "DaemonSet" for o in docs))
PYEOF3
    )
    if [ "$got" = "registry.example:5000/tessera:v1 2 1" ]; then
      ok "an overlay's images: renames every image; with both components it passes ($renderer)"
    else
      bad "an overlay's images: and both components ($renderer): images, ServiceMonitors and DaemonSets $got"
    fi
  done
}
overlay_checks

# verifies CA FILE PURPOSE [NAME]: FILE chains to CA for PURPOSE (sslserver,
# sslclient) and, given NAME, matches it (an IP address or a DNS name).
verifies() {
  local name_flag=()
  if [ -n "${4:-}" ]; then
    if [[ "$4" =~ ^[0-9.]+$ ]]; then name_flag=(-verify_ip "$4"); else name_flag=(-verify_hostname "$4"); fi
  fi
  openssl verify -CAfile "$1" -purpose "$3" "${name_flag[@]}" "$2" >/dev/null 2>&1
}

# deploy/make-certs.sh (which make-secrets.sh, local_cluster.sh --secure and
# the container scripts use): chains, names, key usages, modes, tokens.
make_certs_checks() {
  local d="$TMP/certs" problems=()
  if ! out=$(../make-certs.sh "$d" --workers 2 --san 'tessera-%n' --san 10.1.2.3 2>&1); then
    bad "make-certs.sh failed: $out"
    return
  fi
  [ "$(stat -c %a "$d")" = 700 ] || problems+=("OUTDIR is $(stat -c %a "$d"), not 700")
  for f in "$d"/*.key "$d"/*.token "$d/tokens"; do
    [ "$(stat -c %a "$f")" = 600 ] || problems+=("$(basename "$f") is $(stat -c %a "$f"), not 600")
  done
  for who in coordinator w0 w1; do
    for name in localhost 127.0.0.1 "tessera-$who" 10.1.2.3; do
      verifies "$d/ca.crt" "$d/$who.crt" sslserver "$name" || problems+=("$who: not a server for $name")
    done
    verifies "$d/ca.crt" "$d/$who.crt" sslclient || problems+=("$who: not a TLS client")
  done
  verifies "$d/ca.crt" "$d/w0.crt" sslserver w0 || problems+=("w0: no DNS:w0")
  verifies "$d/ca.crt" "$d/w0.crt" sslserver w1 && problems+=("w0's certificate names w1")
  verifies "$d/ca.crt" "$d/w0.crt" sslserver tessera-w1 && problems+=("w0's certificate names tessera-w1")
  verifies "$d/ca.crt" "$d/user.crt" sslclient || problems+=("user: not a TLS client")
  verifies "$d/ca.crt" "$d/user.crt" sslserver && problems+=("user: usable as a server")
  [ "$(openssl x509 -in "$d/w1.crt" -noout -subject)" = "subject=CN = w1" ] || problems+=("w1: CN is not w1")
  local want="admin admin
writer write
reader read
w0 worker
w1 worker"
  [ "$(grep -v '^#' "$d/tokens" | cut -d' ' -f1,2)" = "$want" ] || problems+=("tokens has other principals: $(cut -d' ' -f1,2 "$d/tokens")")
  for p in admin writer reader w0 w1; do
    grep -qx "$p [a-z]* $(cat "$d/$p.token")" "$d/tokens" || problems+=("$p.token is not $p's secret in tokens")
    [[ "$(cat "$d/$p.token")" =~ ^[0-9a-f]{64}$ ]] || problems+=("$p.token is not 64 hex digits alone")
  done
  [ "$(cut -d' ' -f3 "$d/tokens" | sort -u | wc -l)" -eq 6 ] || problems+=("secrets repeat")
  if ../make-certs.sh "$d" >/dev/null 2>&1; then problems+=("it overwrote an existing CA"); fi
  if compgen -G "$d/etcd-*" >/dev/null; then problems+=("it made etcd's files without --etcd"); fi
  if [ ${#problems[@]} -eq 0 ]; then
    ok "make-certs.sh: chains, names, key usages, modes and tokens"
  else
    bad "make-certs.sh: $(printf '%s; ' "${problems[@]}")"
  fi
}

# make-certs.sh --etcd: a CA of etcd's own, a member certificate (server and
# client: members dial each other) with etcd's names, and a client-only
# certificate for the coordinator; no certificate of one CA passes the other.
make_certs_etcd_checks() {
  local d="$TMP/certs-etcd" problems=() name f
  if ! out=$(../make-certs.sh "$d" --workers 1 --san extra.example --etcd-san member-0.example \
    --etcd-san '*.members.example' 2>&1); then
    bad "make-certs.sh --etcd failed: $out"
    return
  fi
  for name in tessera-etcd localhost 127.0.0.1 member-0.example member-7.members.example; do
    verifies "$d/etcd-ca.crt" "$d/etcd-member.crt" sslserver "$name" || problems+=("etcd-member: not a server for $name")
  done
  verifies "$d/etcd-ca.crt" "$d/etcd-member.crt" sslclient || problems+=("etcd-member: not a TLS client (peers)")
  verifies "$d/etcd-ca.crt" "$d/etcd-member.crt" sslserver extra.example && problems+=("etcd-member carries --san's names")
  verifies "$d/etcd-ca.crt" "$d/etcd-member.crt" sslserver member-1.example && problems+=("etcd-member names member-1.example")
  verifies "$d/etcd-ca.crt" "$d/etcd-coordinator.crt" sslclient || problems+=("etcd-coordinator: not a TLS client")
  verifies "$d/etcd-ca.crt" "$d/etcd-coordinator.crt" sslserver && problems+=("etcd-coordinator: usable as a server")
  [ "$(openssl x509 -in "$d/etcd-coordinator.crt" -noout -subject)" = "subject=CN = tessera-coordinator" ] ||
    problems+=("etcd-coordinator: CN is not tessera-coordinator")
  for f in coordinator w0 user; do
    verifies "$d/etcd-ca.crt" "$d/$f.crt" sslclient && problems+=("$f's certificate opens etcd (etcd's CA signed it)")
  done
  for f in etcd-member etcd-coordinator; do
    verifies "$d/ca.crt" "$d/$f.crt" sslclient && problems+=("$f chains to the cluster's CA")
  done
  for f in "$d"/etcd-*.key; do
    [ "$(stat -c %a "$f")" = 600 ] || problems+=("$(basename "$f") is $(stat -c %a "$f"), not 600")
  done
  [ -e "$d/etcd-ca.key" ] || problems+=("no etcd-ca.key")
  if ../make-certs.sh "$TMP/certs-etcd-clash" --etcd --worker-group etcd-member >/dev/null 2>&1; then
    problems+=("--worker-group etcd-member overwrote etcd's member certificate")
  fi
  if [ ${#problems[@]} -eq 0 ]; then
    ok "make-certs.sh --etcd: etcd's own CA, member and coordinator certificates"
  else
    bad "make-certs.sh --etcd: $(printf '%s; ' "${problems[@]}")"
  fi
}

# Secrets from make-secrets.sh are valid objects, and the base passes with
# them; the certificates name what the manifests dial.
make_secrets_checks() {
  local d="$TMP/secrets" problems=()
  if ! out=$(./make-secrets.sh "$d" test 2>&1); then
    bad "make-secrets.sh failed: $out"
    return
  fi
  for name in tessera-coordinator tessera-coordinator.test.svc.cluster.local 127.0.0.1; do
    verifies "$d/ca.crt" "$d/coordinator.crt" sslserver "$name" || problems+=("coordinator: not a server for $name")
  done
  # (and the inference DaemonSet's pods by their A records)
  for name in tessera-worker-0.tessera-worker.test.svc.cluster.local tessera-worker-7.tessera-worker.test.svc \
    10-1-2-3.test.pod.cluster.local; do
    verifies "$d/ca.crt" "$d/tessera-worker.crt" sslserver "$name" || problems+=("workers: not a server for $name")
  done
  verifies "$d/ca.crt" "$d/tessera-worker.crt" sslclient || problems+=("workers: not TLS clients")
  verifies "$d/ca.crt" "$d/user.crt" sslclient || problems+=("user: not a TLS client")
  grep -qx "tessera-worker-\* worker $(cat "$d/tessera-worker.token")" "$d/tokens" ||
    problems+=("no principal tessera-worker-* with the workers' token")
  grep -qx "tessera-drain admin $(cat "$d/tessera-drain.token")" "$d/tokens" ||
    problems+=("no principal tessera-drain (admin) with the drain token")
  [ "$(stat -c %a "$d/tessera-drain.token")" = 600 ] || problems+=("tessera-drain.token is not 600")
  [ -z "$(grep -v '^#' "$d/tokens" | cut -d' ' -f3 | sort | uniq -d)" ] || problems+=("secrets repeat in tokens")
  # etcd: every member etcd.yaml runs, by each of its names, and any member
  # through the wildcards; only etcd's CA; the Secrets hold the right files.
  local members i
  members=$($PY -c 'import yaml; print(next(d for d in yaml.safe_load_all(open("etcd.yaml"))
                                            if d and d.get("kind") == "StatefulSet")["spec"]["replicas"])')
  for ((i = 0; i < members; i++)); do
    for name in "tessera-etcd-$i.tessera-etcd" "tessera-etcd-$i.tessera-etcd.test" \
      "tessera-etcd-$i.tessera-etcd.test.svc" "tessera-etcd-$i.tessera-etcd.test.svc.cluster.local"; do
      verifies "$d/etcd-ca.crt" "$d/etcd-member.crt" sslserver "$name" || problems+=("etcd members: not a server for $name")
    done
  done
  for name in tessera-etcd-9.tessera-etcd.test.svc tessera-etcd-9.tessera-etcd.test.svc.cluster.local localhost 127.0.0.1; do
    verifies "$d/etcd-ca.crt" "$d/etcd-member.crt" sslserver "$name" || problems+=("etcd members: not a server for $name")
  done
  verifies "$d/etcd-ca.crt" "$d/etcd-member.crt" sslclient || problems+=("etcd members: not TLS clients (peers)")
  verifies "$d/etcd-ca.crt" "$d/etcd-coordinator.crt" sslclient || problems+=("coordinators: no etcd client certificate")
  verifies "$d/etcd-ca.crt" "$d/etcd-coordinator.crt" sslserver && problems+=("the coordinators' etcd certificate serves")
  for f in tessera-worker user coordinator; do
    verifies "$d/etcd-ca.crt" "$d/$f.crt" sslclient && problems+=("$f's certificate opens etcd")
  done
  local secret_problems
  secret_problems=$($PY - "$d" <<'PYEOF2'
import base64, sys, yaml
d = sys.argv[1]
secrets = {s["metadata"]["name"]: s for s in yaml.safe_load_all(open(f"{d}/secrets.yaml")) if s}
want = {"tessera-etcd-tls": ("etcd-ca.crt", "etcd-member.crt", "etcd-member.key"),
        "tessera-coordinator-etcd-tls": ("etcd-ca.crt", "etcd-coordinator.crt", "etcd-coordinator.key"),
        "tessera-coordinator-tls": ("ca.crt", "coordinator.crt", "coordinator.key")}
for name, files in want.items():
    data = (secrets.get(name) or {}).get("data") or {}
    for key, f in zip(("ca.crt", "tls.crt", "tls.key"), files):
        if base64.b64decode(data.get(key, "")) != open(f"{d}/{f}", "rb").read():
            print(f"Secret {name} {key} is not {f}")
PYEOF2
  )
  [ -z "$secret_problems" ] || problems+=("$secret_problems")
  if ! out=$(TESSERA_ETCD_MEMBERS=5 ./make-secrets.sh "$TMP/secrets-5" test 2>&1); then
    problems+=("TESSERA_ETCD_MEMBERS=5 make-secrets.sh failed: $out")
  else
    verifies "$TMP/secrets-5/etcd-ca.crt" "$TMP/secrets-5/etcd-member.crt" sslserver tessera-etcd-4.tessera-etcd ||
      problems+=("TESSERA_ETCD_MEMBERS=5: no tessera-etcd-4.tessera-etcd")
  fi
  if ! out=$($PY check.py . "$d/secrets.yaml" 2>&1); then
    problems+=("the base with make-secrets.sh's Secrets fails: $out")
  fi
  if [ ${#problems[@]} -eq 0 ]; then
    ok "make-secrets.sh makes valid Secrets and certificates"
  else
    bad "make-secrets.sh: $(printf '%s; ' "${problems[@]}")"
  fi
}

if command -v openssl >/dev/null; then
  make_certs_checks
  make_certs_etcd_checks
  make_secrets_checks
else
  echo "  skip make-certs.sh and make-secrets.sh (no openssl)"
fi

echo "check_test: $passed passed, $failed failed"
[ "$failed" -eq 0 ]
