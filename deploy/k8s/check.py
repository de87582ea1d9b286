#!/usr/bin/python3
"""Offline check of tessera's Kubernetes manifests (no cluster needed).

    python3 deploy/k8s/check.py [PATH ...] [--renderer=auto|kubectl|builtin]

PATH is a kustomize directory (default: deploy/k8s) or a YAML file of
rendered objects. A directory is rendered with `kubectl kustomize` when
kubectl is installed, else by a built-in renderer that applies the
`resources`, `components` and `images` of kustomization.yaml (the only keys
it accepts); with kubectl present both run and must agree.
deploy/k8s/secrets.example.yaml is checked alongside the default base. A
directory's optional components (DIR/components/*, kind Component) are each
rendered onto it too, and what they add or change is checked with the rest.

Every object is then validated against the Kubernetes object schema of
Debian's python3-kubernetes: it is built into the client's V1* models field
by field, so unknown fields, wrong types and missing required fields are
errors. That client (22.6) predates gRPC probes (Kubernetes 1.24); the one
field it lacks that we use, Probe.grpc {port (required), service}, is added
below and nothing else. It knows no CRDs: the fields of the Prometheus
Operator's ServiceMonitor that we allow are listed below (CRD_KINDS).

Our rules on top of the schema:
  * every container has a livenessProbe and a readinessProbe (whose port the
    container declares) and resources.limits for cpu and memory;
  * Secrets reach containers only as files: no env from secretKeyRef or
    envFrom secretRef, no plain env value under a secret-looking name, and no
    Secret value (from any Secret checked) in an env value, command or args;
  * every workload runs as non-root (runAsNonRoot true, runAsUser not 0) with
    a read-only root filesystem, no privilege escalation and ALL capabilities
    dropped; no daemon is started with --insecure;
  * a daemon's liveness probe is not a tcpSocket probe (the kernel completes
    TCP connections to a gRPC listener that accepts nothing): it asks
    grpc.health.v1 (service `liveness`);
  * a daemon with TLS has all of --tls_ca/--tls_cert/--tls_key and its tokens
    (coordinator --tokens, worker --token_file); its probes are not the
    kubelet's `grpc` probes (plaintext, no client certificate: they cannot
    pass against mutual TLS), and a worker does not advertise its pod IP
    (--advertise, --data_advertise: no certificate made ahead of time can
    name it; its pod's A record, the IP with dashes under
    NAMESPACE.pod.DOMAIN, which a wildcard names, is a name);
  * a daemon serving --metrics_listen (etcd: --listen-metrics-urls) on a
    non-loopback address (plaintext, no authentication) is selected by an
    Ingress NetworkPolicy, and no policy admits every peer to its metrics
    port;
  * a worker (tessera-worker) has --zone (else its zone is its pod's host
    name, one per pod, and a shard's replicas may share a node), a valid one
    when literal; a --zone read from a file ($(cat FILE)) is on a volume the
    container mounts and an initContainer mounts writable;
  * a worker has a preStop hook that drains it (`tessera worker drain NAME`,
    NAME its --name) with the TLS flags and --token_file when the worker has
    TLS, bounded by drain_limit=SECONDS at least 30 s below the pod's
    terminationGracePeriodSeconds;
  * a worker's ports (README.md "TCP data ports"): each it listens on beyond
    loopback (--listen, --data_listen, --health_listen, --metrics_listen) is
    a containerPort, and the two readers dial (gRPC, data) are ports of its
    Service, advertised (--advertise, --data_advertise) at the port they
    listen on; beyond loopback it has --data_listen (else the system picks
    the data port, which nothing can name); the NetworkPolicies admit its
    data port from exactly the peers they admit its gRPC port from; under
    TLS its --data_advertise host is its --advertise host, the name its
    certificate carries, against which readers check the data port;
  * a worker's --labels parse as the worker reads them (core/labels.h): at
    most 32 KEY=VALUE pairs, no key twice, a key 1 to 63 of letters, digits,
    _ . - / starting with a letter or digit, a value 0 to 63 of letters,
    digits, _ . -; a $(VAR) in them names an env var of the container, from
    the downward API (any value) or with a literal value (checked);
  * a DaemonSet of tessera daemons selects its nodes (a nodeSelector or a
    required node affinity: never every node of the cluster) and is updated
    by RollingUpdate with rollingUpdate.maxUnavailable 1 (one node's worker
    at a time, each drained first);
  * a daemon's container holds no Kubernetes API token (the pod or its
    ServiceAccount sets automountServiceAccountToken: false, and no
    serviceAccountToken volume is mounted in it);
  * the highly available coordinator (CLI.md "Highly available
    coordinator"): an etcd StatefulSet has an odd number of members, 3 or
    more, its --data-dir on a PersistentVolumeClaim of its own, Parallel pod
    management, a headless Service that publishes pods not ready yet, an
    --initial-cluster naming exactly its members, a PodDisruptionBudget of
    maxUnavailable 1, and a client port that no NetworkPolicy opens to
    every pod and one admits the coordinators to;
  * etcd's own TLS: where the cluster runs TLS (a daemon has --tls_ca), an
    etcd member serves clients and peers over https only (listen, advertise
    and --initial-cluster URLs), with --client-cert-auth and
    --peer-client-cert-auth, and its --cert-file/--key-file/--trusted-ca-file
    and --peer-* files are keys of a Secret mounted read-only (one of the
    Secrets checked, when any are); no httpGet probe asks a client port that
    the kubelet's probe cannot pass (TLS wanting a client certificate); a
    coordinator whose etcd serves TLS passes --etcd_ca (and --etcd_cert and
    --etcd_key under --client-cert-auth) from such a Secret, and no
    --etcd_ca to an etcd that serves plaintext;
  * the highly available coordinator, continued: a coordinator with
    --metadata=etcd://... has no --data_dir, names every etcd member, runs
    as a StatefulSet of 2 or more behind such a headless Service, and
    advertises its pod's own name; with network probes (a standby is never
    ready) it has a startupProbe that asks the liveness service (or waits a
    day or more), updateStrategy OnDelete and no PodDisruptionBudget; every
    --coordinator= of a worker (daemon, preStop and scripts) names every
    coordinator pod;
  * every container image of a kustomize directory's manifests is named by
    an `images:` entry (so `kustomize edit set image` and an overlay's
    `images:` change them all), and every entry names an image; a
    component's images too, and where the base's entry names one, the
    component's container has the base's image (the base's entry does not
    reach a component's containers; an overlay's does);
  * a ServiceMonitor selects a Service of the manifests, and each endpoint
    names a port of it that leads to a daemon's metrics port, path /metrics;
    a base that offers components holds no ServiceMonitor itself (it would
    then need the Prometheus Operator's CRD);
  * references hold: a StatefulSet's serviceName, the selector of a
    StatefulSet, DaemonSet, Deployment or ReplicaSet (its pod template's
    labels), Service and PodDisruptionBudget selectors and named
    targetPorts match a workload; a
    pod's serviceAccountName, and the ServiceAccount subjects (with a
    namespace) and roleRef of every RoleBinding and ClusterRoleBinding, name
    objects in the manifests; every Role and ClusterRole is bound, and none
    grants `*`.

Prints one line per problem and a closing "k8s check: ..." line; exits 1 when
anything fails.
"""

import argparse
import base64
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile

import yaml

try:
    from kubernetes import client as k8s_client
    from kubernetes.client import models as k8s_models
except ImportError:  # pragma: no cover - depends on the machine
    sys.exit("k8s check: needs python3-kubernetes (apt-get install python3-kubernetes; "
             "scripts/setup.sh installs it); run it with /usr/bin/python3")

HERE = os.path.dirname(os.path.abspath(__file__))
WORKLOAD_KINDS = {"Deployment", "StatefulSet", "DaemonSet", "ReplicaSet", "Job", "CronJob", "Pod"}
SECRET_NAME = re.compile(r"(TOKEN|SECRET|PASSW|PRIVATE|CREDENTIAL|(^|_)KEY$|APIKEY)", re.I)

# Fields newer than the installed client, as (python attribute, JSON name, type).
GRPC_ACTION = "TesseraGRPCAction"
EXTRA_FIELDS = {"V1Probe": [("grpc", "grpc", GRPC_ACTION)]}
EXTRA_MODELS = {GRPC_ACTION: {"required": {"port"}, "fields": {"port": "int", "service": "str"}}}

# Kinds of CRDs, which python3-kubernetes does not know: the fields of the
# Prometheus Operator's ServiceMonitor (monitoring.coreos.com/v1) that these
# manifests may use; any other is refused as unknown.
MONITOR, MONITOR_SPEC, MONITOR_ENDPOINT, NAMESPACES = (
    "TesseraServiceMonitor", "TesseraServiceMonitorSpec", "TesseraServiceMonitorEndpoint",
    "TesseraNamespaceSelector")
CRD_KINDS = {("monitoring.coreos.com/v1", "ServiceMonitor"): MONITOR}
EXTRA_MODELS.update({
    MONITOR: {"required": {"apiVersion", "kind", "metadata", "spec"},
              "fields": {"apiVersion": "str", "kind": "str", "metadata": "V1ObjectMeta",
                         "spec": MONITOR_SPEC}},
    MONITOR_SPEC: {"required": {"selector"},
                   "fields": {"selector": "V1LabelSelector", "endpoints": f"list[{MONITOR_ENDPOINT}]",
                              "namespaceSelector": NAMESPACES, "jobLabel": "str",
                              "targetLabels": "list[str]", "podTargetLabels": "list[str]",
                              "sampleLimit": "int", "targetLimit": "int", "labelLimit": "int",
                              "labelNameLengthLimit": "int", "labelValueLengthLimit": "int",
                              "keepDroppedTargets": "int", "attachMetadata": "object",
                              "scrapeClass": "str", "scrapeProtocols": "list[str]",
                              "bodySizeLimit": "str"}},
    NAMESPACES: {"required": set(), "fields": {"any": "bool", "matchNames": "list[str]"}},
    MONITOR_ENDPOINT: {"required": set(),
                       "fields": {"port": "str", "targetPort": "object", "path": "str",
                                  "scheme": "str", "params": "object", "interval": "str",
                                  "scrapeTimeout": "str", "honorLabels": "bool",
                                  "honorTimestamps": "bool", "trackTimestampsStaleness": "bool",
                                  "tlsConfig": "object", "authorization": "object",
                                  "basicAuth": "object", "oauth2": "object",
                                  "bearerTokenSecret": "object", "metricRelabelings": "list[object]",
                                  "relabelings": "list[object]", "proxyUrl": "str",
                                  "followRedirects": "bool", "enableHttp2": "bool",
                                  "filterRunning": "bool"}},
})


class Problems:
    def __init__(self):
        self.items = []

    def add(self, where, what):
        self.items.append(f"{where}: {what}")


# ---- rendering -----------------------------------------------------------------

# libyaml's loader where PyYAML has it (Debian's does): the same safe
# subset, ten times faster than the pure-Python one.
SAFE_LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


def load_yaml_docs(path):
    with open(path) as f:
        return [d for d in yaml.load_all(f, Loader=SAFE_LOADER) if d is not None]


KUSTOMIZATION_FILES = ("kustomization.yaml", "kustomization.yml", "Kustomization")


def kustomization_of(directory):
    """(path, content) of DIRECTORY's kustomization file."""
    kfile = next((os.path.join(directory, n) for n in KUSTOMIZATION_FILES
                  if os.path.exists(os.path.join(directory, n))), None)
    if kfile is None:
        raise ValueError(f"{directory}: no kustomization.yaml")
    with open(kfile) as f:
        return kfile, yaml.load(f, Loader=SAFE_LOADER) or {}


def split_image(ref):
    """(name, tag, digest) of an image reference; a registry's :port is in the name."""
    name, _, digest = ref.partition("@")
    tag = None
    if name.rfind(":") > name.rfind("/"):
        name, tag = name.rsplit(":", 1)
    return name, tag, digest or None


def containers_of(obj):
    if not isinstance(obj, dict) or obj.get("kind") not in WORKLOAD_KINDS:
        return []
    spec = pod_spec_of(obj) or {}
    return [c for field in ("initContainers", "containers", "ephemeralContainers")
            for c in spec.get(field) or [] if isinstance(c, dict)]


def apply_images(docs, entries):
    """kustomize's `images:`: an entry whose name is an image's name (tag and
    digest aside) gives it newName, newTag or digest."""
    for e in entries:
        for o in docs:
            for c in containers_of(o):
                name, tag, digest = split_image(str(c.get("image", "")))
                if name != e.get("name"):
                    continue
                name = e.get("newName") or name
                if e.get("digest"):
                    tag, digest = None, e["digest"]
                elif e.get("newTag") is not None:
                    tag, digest = str(e["newTag"]), None
                c["image"] = name + (f":{tag}" if tag else "") + (f"@{digest}" if digest else "")


def render_builtin(directory, accumulated=None):
    """The objects of a kustomization: its resources, then its components
    (each adds to what is there), then its `images:`. A Component is rendered
    onto `accumulated`, the objects of the kustomization that names it."""
    kfile, k = kustomization_of(directory)
    if accumulated is not None and k.get("kind") != "Component":
        raise ValueError(f"{kfile}: named in `components` but of kind {k.get('kind')}, not Component")
    extra = set(k) - {"apiVersion", "kind", "resources", "components", "images"}
    if extra:
        raise ValueError(f"{kfile}: the built-in renderer only applies `resources`, `components` "
                         f"and `images`; it cannot apply {sorted(extra)} (install kubectl, or keep "
                         "the base plain)")
    docs = list(accumulated or [])
    for r in k.get("resources") or []:
        p = os.path.join(directory, r)
        docs.extend(render_builtin(p) if os.path.isdir(p) else load_yaml_docs(p))
    for c in k.get("components") or []:
        docs = render_builtin(os.path.join(directory, c), docs)
    seen = set()
    for o in (o for o in docs if isinstance(o, dict)):
        key = object_key(o) + (str((o.get("metadata") or {}).get("namespace")),)
        if key in seen:  # as kustomize refuses it
            raise ValueError(f"{kfile}: {key[1]}/{key[2]} is in the manifests twice")
        seen.add(key)
    apply_images(docs, k.get("images") or [])
    return docs


def kustomize_sources(directory):
    """(the kustomization files' contents, the objects of their resource files
    as written, before any `images:`) of DIRECTORY and what it includes."""
    _, k = kustomization_of(directory)
    kustomizations, docs = [k], []
    for r in (k.get("resources") or []) + (k.get("components") or []):
        p = os.path.join(directory, r)
        if os.path.isdir(p):
            sub_k, sub_docs = kustomize_sources(p)
            kustomizations += sub_k
            docs += sub_docs
        else:
            docs += load_yaml_docs(p)
    return kustomizations, docs


def components_of(directory):
    """The kustomize Components a base offers, in DIRECTORY/components/*."""
    root = os.path.join(directory, "components")
    if not os.path.isdir(root):
        return []
    out = []
    for n in sorted(os.listdir(root)):
        p = os.path.join(root, n)
        try:
            if os.path.isdir(p) and kustomization_of(p)[1].get("kind") == "Component":
                out.append(p)
        except (OSError, ValueError, yaml.YAMLError):
            out.append(p)  # rendering it says what is wrong
    return out


def render_kubectl(directory):
    out = subprocess.run(["kubectl", "kustomize", directory], capture_output=True, text=True)
    if out.returncode != 0:
        raise ValueError(f"kubectl kustomize {directory} failed: {out.stderr.strip()}")
    return [d for d in yaml.load_all(out.stdout, Loader=SAFE_LOADER) if d is not None]


def object_key(o):
    meta = o.get("metadata") or {}
    return (str(o.get("apiVersion")), str(o.get("kind")), str(meta.get("name")))


def render(path, renderer, problems, label=None):
    if os.path.isfile(path):
        return load_yaml_docs(path)
    have_kubectl = shutil.which("kubectl") is not None
    if renderer == "kubectl" or (renderer == "auto" and have_kubectl):
        docs = render_kubectl(path)
        try:
            builtin = render_builtin(path)
        except ValueError:
            return docs  # the base uses kustomize features: kubectl's render is the truth
        a = {object_key(o): o for o in docs}
        b = {object_key(o): o for o in builtin}
        if a != b:
            differ = sorted(set(a) ^ set(b)) or sorted(k for k in a if a[k] != b.get(k))
            problems.add(label or path, f"the built-in renderer and kubectl kustomize disagree on {differ}")
        return docs
    return render_builtin(path)


def render_with_component(base, component, renderer, problems, label):
    """The base with one of its components, as an overlay naming both renders it."""
    with tempfile.TemporaryDirectory(prefix="tessera-k8s-overlay.") as d:
        with open(os.path.join(d, "kustomization.yaml"), "w") as f:
            # kustomize takes no absolute paths here.
            yaml.safe_dump({"apiVersion": "kustomize.config.k8s.io/v1beta1", "kind": "Kustomization",
                            "resources": [os.path.relpath(base, d)],
                            "components": [os.path.relpath(component, d)]}, f)
        try:
            return render(d, renderer, problems, label)
        except ValueError as e:
            raise ValueError(str(e).replace(d, "(an overlay)")) from None


# ---- schema --------------------------------------------------------------------

def model_class(api_version, kind):
    """The client's model for apiVersion/kind, checking that the group serves the kind."""
    group, _, version = api_version.rpartition("/")
    cls_name = version[:1].upper() + version[1:] + kind
    cls = getattr(k8s_models, cls_name, None)
    # The client's API class: group rbac.authorization.k8s.io -> RbacAuthorizationV1Api.
    base = group[:-len(".k8s.io")] if group.endswith(".k8s.io") else (group or "core")
    api_name = "".join(p.capitalize() for p in re.split(r"[.-]", base))
    api = getattr(k8s_client, f"{api_name}{version[:1].upper() + version[1:]}Api", None)
    snake = re.sub(r"(?<!^)(?=[A-Z])", "_", kind).lower()
    if cls is None or api is None or not (hasattr(api, f"create_namespaced_{snake}") or
                                          hasattr(api, f"create_{snake}")):
        return None
    return cls


def build(value, type_name, path, problems, parent_attr=""):
    """Builds the client model for `value` of openapi type `type_name`; records problems."""
    if type_name.startswith("list["):
        if not isinstance(value, list):
            problems.add(path, f"expected a list, got {type(value).__name__}")
            return None
        return [build(v, type_name[5:-1], f"{path}[{i}]", problems) for i, v in enumerate(value)]
    if type_name.startswith("dict("):
        inner = type_name[type_name.index(",") + 1:-1].strip()
        if not isinstance(value, dict):
            problems.add(path, f"expected a mapping, got {type(value).__name__}")
            return None
        out = {}
        for k, v in value.items():
            if not isinstance(k, str):
                problems.add(path, f"key {k!r} is not a string")
            # Quantities (resource limits/requests) may be written as numbers.
            if inner == "str" and parent_attr in ("limits", "requests") and \
                    isinstance(v, (int, float)) and not isinstance(v, bool):
                out[k] = str(v)
            else:
                out[k] = build(v, inner, f"{path}.{k}", problems)
        return out
    if type_name == "object":
        return value
    if type_name in ("str", "datetime", "date"):
        if not isinstance(value, str):
            problems.add(path, f"expected a string, got {type(value).__name__} {value!r}")
        return value
    if type_name == "int":
        if not isinstance(value, int) or isinstance(value, bool):
            problems.add(path, f"expected an integer, got {type(value).__name__} {value!r}")
        return value
    if type_name == "float":
        if not isinstance(value, (int, float)) or isinstance(value, bool):
            problems.add(path, f"expected a number, got {value!r}")
        return value
    if type_name == "bool":
        if not isinstance(value, bool):
            problems.add(path, f"expected true or false, got {value!r}")
        return value
    if type_name in EXTRA_MODELS:
        spec = EXTRA_MODELS[type_name]
        if not isinstance(value, dict):
            problems.add(path, f"expected an object ({type_name}), got {type(value).__name__}")
            return None
        for k in sorted(set(value) - set(spec["fields"])):
            problems.add(f"{path}.{k}", "unknown field")
        for k in sorted(spec["required"] - set(value)):
            problems.add(f"{path}.{k}", "required field missing")
        for k, t in spec["fields"].items():
            if k in value:
                build(value[k], t, f"{path}.{k}", problems)
        return value
    cls = getattr(k8s_models, type_name, None)
    if cls is None:
        problems.add(path, f"no model {type_name} in python3-kubernetes")
        return None
    if not isinstance(value, dict):
        problems.add(path, f"expected an object ({type_name}), got {type(value).__name__}")
        return None
    json_to_attr = {j: a for a, j in cls.attribute_map.items()}
    extra = {j: (a, t) for a, j, t in EXTRA_FIELDS.get(type_name, []) if j not in json_to_attr}
    kwargs = {}
    for key, v in value.items():
        if key in extra:
            build(v, extra[key][1], f"{path}.{key}", problems)
            continue
        attr = json_to_attr.get(key)
        if attr is None:
            problems.add(f"{path}.{key}", f"unknown field (not in {type_name})")
            continue
        kwargs[attr] = build(v, cls.openapi_types[attr], f"{path}.{key}", problems, attr)
    try:
        return cls(**kwargs)  # the models check required fields and enums
    except (ValueError, TypeError) as e:
        problems.add(path, f"{type_name}: {e}")
        return None


def validate_schema(obj, where, problems):
    api_version, kind = obj.get("apiVersion"), obj.get("kind")
    if not isinstance(api_version, str) or not isinstance(kind, str):
        problems.add(where, "apiVersion and kind are required")
        return
    if (api_version, kind) in CRD_KINDS:
        if not (obj.get("metadata") or {}).get("name"):
            problems.add(where, "metadata.name is required")
        build(obj, CRD_KINDS[(api_version, kind)], where, problems)
        return
    cls = model_class(api_version, kind)
    if cls is None:
        problems.add(where, f"{api_version} {kind} is not a Kubernetes kind python3-kubernetes knows")
        return
    if not (obj.get("metadata") or {}).get("name"):
        problems.add(where, "metadata.name is required")
    build(obj, cls.__name__, where, problems)


# ---- our rules -----------------------------------------------------------------

def pod_spec_of(obj):
    kind, spec = obj.get("kind"), obj.get("spec") or {}
    if kind == "Pod":
        return spec
    if kind == "CronJob":
        return (((spec.get("jobTemplate") or {}).get("spec") or {}).get("template") or {}).get("spec")
    return (spec.get("template") or {}).get("spec")


def pod_labels_of(obj):
    if obj.get("kind") == "Pod":
        return (obj.get("metadata") or {}).get("labels") or {}
    return (((obj.get("spec") or {}).get("template") or {}).get("metadata") or {}).get("labels") or {}


def secret_values(objects):
    values = set()
    for o in objects:
        if o.get("kind") != "Secret":
            continue
        for v in (o.get("stringData") or {}).values():
            values.add(str(v))
        for v in (o.get("data") or {}).values():
            try:
                values.add(base64.b64decode(str(v)).decode("utf-8", "replace"))
            except ValueError:
                pass
    # Every non-trivial line too (a tokens file holds one secret per line).
    for v in list(values):
        for line in v.splitlines():
            for word in line.split():
                if len(word) >= 8:
                    values.add(word)
    return {v for v in values if len(v.strip()) >= 8}


def check_container(c, pod_sc, where, secrets, problems):
    name = c.get("name", "?")
    w = f"{where} container {name}"
    ports = {p.get("name"): p.get("containerPort") for p in c.get("ports") or []}
    if not c.get("_init"):
        for probe in ("livenessProbe", "readinessProbe"):
            p = c.get(probe)
            if not p:
                problems.add(w, f"no {probe}")
                continue
            action = p.get("grpc") or p.get("httpGet") or p.get("tcpSocket")
            port = (action or {}).get("port")
            if action is not None and port not in ports.values() and port not in ports:
                problems.add(w, f"{probe} port {port!r} is not a port the container declares")
    limits = (c.get("resources") or {}).get("limits") or {}
    for r in ("cpu", "memory"):
        if r not in limits:
            problems.add(w, f"no resources.limits.{r}")
    for e in c.get("env") or []:
        vf = e.get("valueFrom") or {}
        if "secretKeyRef" in vf:
            problems.add(w, f"env {e.get('name')} comes from a Secret; mount Secrets as files")
        if "value" in e:
            value = str(e["value"])
            if SECRET_NAME.search(str(e.get("name", ""))):
                problems.add(w, f"env {e.get('name')} holds a plain value under a secret-looking name")
            if any(s in value for s in secrets):
                problems.add(w, f"env {e.get('name')} holds a Secret's value in plain text")
    for e in c.get("envFrom") or []:
        if "secretRef" in e:
            problems.add(w, "envFrom a Secret; mount Secrets as files")
    words = [str(x) for x in (c.get("command") or []) + (c.get("args") or [])]
    if any(s in x for s in secrets for x in words):
        problems.add(w, "command/args hold a Secret's value in plain text")
    if any(re.search(r"--insecure\b", x) for x in words):
        problems.add(w, "starts a daemon with --insecure")
    check_security(c, " ".join(words), w, problems)
    sc = c.get("securityContext") or {}
    non_root = sc.get("runAsNonRoot", pod_sc.get("runAsNonRoot"))
    user = sc.get("runAsUser", pod_sc.get("runAsUser"))
    if non_root is not True:
        problems.add(w, "does not set runAsNonRoot: true (pod or container securityContext)")
    if user == 0:
        problems.add(w, "runs as uid 0")
    if sc.get("readOnlyRootFilesystem") is not True:
        problems.add(w, "no readOnlyRootFilesystem: true")
    if sc.get("allowPrivilegeEscalation") is not False:
        problems.add(w, "no allowPrivilegeEscalation: false")
    if sc.get("privileged"):
        problems.add(w, "privileged")
    if "ALL" not in ((sc.get("capabilities") or {}).get("drop") or []):
        problems.add(w, "does not drop ALL capabilities")


DAEMON = re.compile(r"(?:^|[\s/\"'])(tessera-coordinator|tessera-worker)(?:\s|$)")


def command_text(c):
    return " ".join(str(x) for x in (c.get("command") or []) + (c.get("args") or []))


def daemon_of(c):
    """tessera-coordinator or tessera-worker when the container starts one, else None."""
    started = DAEMON.search(command_text(c))
    return started.group(1) if started else None


def daemon_line(text):
    """The daemon's command line in a container's command text: from the daemon's name
    to the end of the line, backslash-newline continuations included (a script may
    also run the CLI with flags of its own)."""
    started = DAEMON.search(text)
    if started is None:
        return ""
    line = re.match(r"(?:[^\n]*\\\n)*[^\n]*", text[started.start(1):])
    return line.group(0)


def check_security(c, text, w, problems):
    """The TLS and token flags of a daemon started by this container (CLI.md "Security")."""
    daemon = daemon_of(c)
    if daemon is None:
        return
    text = daemon_line(text)
    if "tcpSocket" in (c.get("livenessProbe") or {}):
        problems.add(w, f"{daemon}'s livenessProbe is a TCP probe, which passes while the gRPC "
                        "port accepts nothing; ask grpc.health.v1 (service liveness) on the "
                        "--health_listen port")
    tls = [f for f in ("--tls_ca", "--tls_cert", "--tls_key") if re.search(f + r"=", text)]
    if not tls:
        return
    for f in sorted({"--tls_ca", "--tls_cert", "--tls_key"} - set(tls)):
        problems.add(w, f"{daemon} has TLS flags but no {f}")
    token_flag = "--tokens" if daemon == "tessera-coordinator" else "--token_file"
    if not re.search(token_flag + r"=", text):
        problems.add(w, f"{daemon} has TLS but no {token_flag} (tokens say who may do what)")
    # The kubelet's gRPC probe speaks plaintext: under TLS it must target the
    # daemon's plaintext health port (--health_listen), never the main one.
    health = re.search(r"--health_listen=\S*:(\d+)", text)
    health_port = int(health.group(1)) if health else None
    named = {p.get("name"): p.get("containerPort") for p in c.get("ports") or []}
    for probe in ("startupProbe", "livenessProbe", "readinessProbe"):
        grpc_action = (c.get(probe) or {}).get("grpc")
        if grpc_action is None:
            continue
        port = grpc_action.get("port")
        port = named.get(port, port)
        if health_port is None or port != health_port:
            problems.add(w, f"{probe} is a gRPC probe on port {port!r}, which cannot pass "
                            "against mutual TLS (the kubelet's gRPC probe has no TLS); "
                            "probe the --health_listen port")
    pod_ip_vars = {e.get("name") for e in c.get("env") or []
                   if (((e.get("valueFrom") or {}).get("fieldRef") or {}).get("fieldPath")
                       == "status.podIP")}
    env = container_env(c)
    for name in ("advertise", "data_advertise"):
        value = flag(text, name)
        if value is None:
            continue
        value = expand(value, env)
        if any(re.search(r"\$\{?\(?" + re.escape(v) + r"\b", value) for v in pod_ip_vars) and \
                not pod_a_record(value, pod_ip_vars):
            problems.add(w, f"{daemon} advertises its pod IP under TLS (--{name}); no certificate "
                            "made ahead of time names it: advertise the pod's DNS name (its name "
                            "under a headless Service, or its A record "
                            "IP-WITH-DASHES.NAMESPACE.pod.DOMAIN, which a wildcard names)")


def pod_a_record(value, pod_ip_vars):
    """True when HOST:PORT is the pod's A record, the pod IP with dashes for
    its dots (and colons) under NAMESPACE.pod.DOMAIN: the host's first label
    is a command substitution that rewrites the pod-IP variable with sed or tr."""
    host = (host_port(value) or (value, 0))[0]
    m = re.match(r"^\$\(([^()]*)\)\.[^.]+\.pod\.[A-Za-z0-9.${}()_-]+$", host)
    return bool(m) and re.search(r"\b(sed|tr)\b", m.group(1)) is not None and \
        any(re.search(r"\$\{?" + re.escape(v) + r"\b", m.group(1)) for v in pod_ip_vars)


ZONE = re.compile(r"^[A-Za-z0-9_.:/-]{1,64}$")


def unquote(word):
    """A shell word's text without quotes, braces and `$`: "${POD_NAME}" -> POD_NAME."""
    return re.sub(r"[\"'{}$]", "", word)


def check_worker(c, spec, where, problems):
    """A worker's --zone and its preStop drain (CLI.md "Replicas")."""
    w = f"{where} container {c.get('name', '?')}"
    text = daemon_line(command_text(c))
    zone = re.search(r"--zone=(\"[^\"]*\"|'[^']*'|\S+)", text)
    if zone is None:
        problems.add(w, "tessera-worker has no --zone: its zone is then its pod's host name, one "
                        "per pod, so a shard's replicas may share a node or a zone (pass the "
                        "node's topology.kubernetes.io/zone)")
    else:
        value = zone.group(1)
        from_file = re.search(r"\$\(\s*cat\s+([^)\s\"']+)\s*\)", value)
        if from_file:
            check_zone_file(c, spec, from_file.group(1), w, problems)
        elif "$" not in value and not ZONE.match(value.strip("\"'")):
            problems.add(w, f"--zone={value} is not a zone (1 to 64 of letters, digits, _ . - : /)")

    hook = (((c.get("lifecycle") or {}).get("preStop") or {}).get("exec") or {}).get("command") or []
    hook_text = " ".join(str(x) for x in hook)
    drain = re.search(r"\bworker\s+drain\s+([^\s()]+)", hook_text)
    if drain is None or not re.search(r"\btessera\b", hook_text):
        problems.add(w, "tessera-worker has no preStop hook that drains it (`tessera worker drain "
                        "NAME`): a deleted or evicted pod takes its shards with it")
        return
    name = re.search(r"--name=(\S+)", text)
    if name and unquote(drain.group(1)) != unquote(name.group(1)):
        problems.add(w, f"the preStop hook drains {drain.group(1)}, not this worker's "
                        f"--name={name.group(1)}")
    if re.search(r"--tls_ca=", text):
        for flag in ("--tls_ca", "--tls_cert", "--tls_key", "--token_file"):
            env = "TESSERA_" + flag[2:].upper()
            if not re.search(flag + "=", hook_text) and env not in hook_text:
                problems.add(w, f"the preStop drain has no {flag} (the worker has TLS; a drain "
                                "needs the admin role)")
    limit = re.search(r"\bdrain_limit=(\d+)", hook_text)
    grace = spec.get("terminationGracePeriodSeconds", 30)
    if limit is None:
        problems.add(w, "the preStop drain has no bound (drain_limit=SECONDS)")
    elif isinstance(grace, int) and grace < int(limit.group(1)) + 30:
        problems.add(w, f"terminationGracePeriodSeconds {grace} is shorter than the preStop "
                        f"drain's drain_limit={limit.group(1)} + 30 s: the kubelet kills the "
                        "worker mid-drain")


def check_zone_file(c, spec, path, w, problems):
    """--zone="$(cat PATH)": PATH is on a volume that an initContainer writes."""
    mount = next((m for m in c.get("volumeMounts") or []
                  if path.startswith(str(m.get("mountPath", "")).rstrip("/") + "/")), None)
    if mount is None:
        problems.add(w, f"--zone reads {path}, which is on no volume the container mounts")
        return
    writers = [i for i in spec.get("initContainers") or []
               for m in i.get("volumeMounts") or []
               if m.get("name") == mount.get("name") and not m.get("readOnly")]
    if not writers:
        problems.add(w, f"--zone reads {path}, which no initContainer writes (none mounts "
                        f"volume {mount.get('name')!r} writable)")


# Worker labels (core/labels.h): at most 32 pairs KEY=VALUE, a key 1 to 63 of
# letters, digits, _ . - / starting with a letter or digit, a value 0 to 63
# of letters, digits, _ . -; a malformed or repeated one: the worker exits 2.
LABEL_KEY = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_./-]{0,62}$")
LABEL_VALUE_CHARS = re.compile(r"^[A-Za-z0-9_.-]*$")
MAX_LABELS, MAX_LABEL_VALUE = 32, 63
# $(VAR), which the kubelet puts in (command and args), and the shell's
# ${VAR} and $VAR.
ENV_REFERENCE = re.compile(r"\$\(([A-Za-z_][A-Za-z0-9_.-]*)\)|\$\{([A-Za-z_]\w*)\}"
                           r"|\$([A-Za-z_]\w*)")
# What the container runtime sets in every container's environment.
RUNTIME_ENV = {"HOSTNAME"}


def labels_problems(value, c):
    """Why a worker's --labels=VALUE does not parse, as the worker reads it
    (core/labels.cc ParseLabels). A $(VAR) (or, in a shell, ${VAR} / $VAR)
    of an env var the container defines from the downward API stands for a
    valid value; one with a literal value is put in; one the container does
    not define is a problem (the kubelet leaves $(VAR) as it is, and the
    shell runs it as a command)."""
    out = []  # (why, whether the worker exits 2 on it)
    env = {e.get("name"): e for e in c.get("env") or []}
    literal = container_env(c)
    shell = any(re.search(r"(^|/)(ba|da)?sh$", str(x)) for x in c.get("command") or [])
    holes = {}  # placeholder -> the reference it stands for
    reported = {}  # the same, for references already found wrong

    def hole(ref, into):
        h = f"\x00{len(holes) + len(reported)}\x01"
        into[h] = ref
        return h

    def resolve(m):
        ref, name = m.group(0), next(g for g in m.groups() if g)
        if not ref.startswith("$(") and not shell:
            return ref  # no shell: the worker gets the text as it is
        e = env.get(name)
        if e is None and (ref.startswith("$(") or name not in RUNTIME_ENV):
            out.append((f"{ref} names no env var of the container (the kubelet leaves $(VAR) "
                        "as it is, and a shell runs it as a command)", False))
            return hole(ref, reported)
        if e is not None and "value" in e:
            return literal.get(name, str(e["value"]))
        source = (e or {}).get("valueFrom") or {}
        if e is not None and not ({"fieldRef", "resourceFieldRef"} & set(source)):
            out.append((f"{ref} comes from neither a literal value nor the downward API "
                        f"({', '.join(sorted(source)) or 'nothing'}): check.py cannot tell it is "
                        "a label value", False))
            return hole(ref, reported)
        return hole(ref, holes)

    def shown(s):
        for h, ref in list(holes.items()) + list(reported.items()):
            s = s.replace(h, ref)
        return s

    text = ENV_REFERENCE.sub(resolve, value)
    if text == "":
        return out
    pairs = text.split(",")
    if len(pairs) > MAX_LABELS:
        out.append((f"{len(pairs)} labels (at most {MAX_LABELS})", True))
    seen = set()
    for pair in pairs:
        if "=" not in pair:
            out.append((f"'{shown(pair)}' is not KEY=VALUE (labels are KEY=VALUE,KEY=VALUE...)",
                        True))
            continue
        key, val = pair.split("=", 1)
        if any(h in key for h in reported):
            pass  # said above
        elif any(h in key for h in holes):
            out.append((f"label key '{shown(key)}' comes from the environment: write keys out",
                        False))
        elif not LABEL_KEY.match(key):
            out.append((f"label key '{key}' must be 1 to 63 of letters, digits, _ . - and / "
                        "starting with a letter or digit", True))
        if key in seen:
            out.append((f"label '{shown(key)}' is given twice", True))
        seen.add(key)
        written = re.sub("\x00\\d+\x01", "", val)
        if any(h in val for h in reported):
            continue  # said above
        if len(written) > MAX_LABEL_VALUE or not LABEL_VALUE_CHARS.match(written):
            out.append((f"the value of label '{shown(key)}', '{shown(val)}', must be 0 to "
                        f"{MAX_LABEL_VALUE} of letters, digits, _ . and -", True))
    return out


def check_labels(c, where, problems):
    """A worker's --labels parse as the worker reads them, else it exits 2."""
    w = f"{where} container {c.get('name', '?')}"
    text = daemon_line(command_text(c))
    for m in re.finditer(r"(?:^|\s)--labels=(\"[^\"]*\"|'[^']*'|\S+)", text):
        value = m.group(1).strip("\"'")
        for why, exits in labels_problems(value, c):
            problems.add(w, f"--labels={value}: {why}{' (the worker exits 2)' if exits else ''}")


def check_daemonset(ds, where, problems):
    """A DaemonSet of tessera workers: on the nodes it names (never every node
    of the cluster), replaced one node at a time."""
    spec = ds.get("spec") or {}
    pod = pod_spec_of(ds) or {}
    daemons = sorted({d for c in pod.get("containers") or [] for d in [daemon_of(c)] if d})
    if not daemons:
        return
    required = ((((pod.get("affinity") or {}).get("nodeAffinity") or {})
                 .get("requiredDuringSchedulingIgnoredDuringExecution") or {})
                .get("nodeSelectorTerms") or [])
    restricted = [term for term in required
                  if (term or {}).get("matchExpressions") or (term or {}).get("matchFields")]
    if not pod.get("nodeSelector") and not (required and len(restricted) == len(required)):
        problems.add(where, f"a DaemonSet of {', '.join(daemons)} without a nodeSelector or a "
                            "required node affinity runs one on every node of the cluster: "
                            "select the nodes it belongs on (e.g. nodeSelector "
                            "tessera.dev/inference: \"true\")")
    strategy = spec.get("updateStrategy") or {}
    kind = strategy.get("type", "RollingUpdate")
    unavailable = (strategy.get("rollingUpdate") or {}).get("maxUnavailable")
    if kind != "RollingUpdate":
        problems.add(where, f"updateStrategy {kind}: a DaemonSet of {', '.join(daemons)} is "
                            "updated by RollingUpdate with rollingUpdate.maxUnavailable: 1 (an "
                            "update otherwise waits for someone to delete each pod)")
    elif unavailable != 1:
        said = "has no rollingUpdate.maxUnavailable" if unavailable is None else \
            f"rollingUpdate.maxUnavailable is {unavailable!r}, not 1"
        problems.add(where, f"{said}: a rollout replaces one node's worker at a time, each "
                            "drained first (two at once can take both replicas of a shard with "
                            "--replicas=2), so say maxUnavailable: 1")


def host_port(value):
    """(host, port) of HOST:PORT, port an int, or None when the port is not a number."""
    host, sep, port = (value or "").rpartition(":")
    if not sep or not port.isdigit():
        return None
    return host.strip("[]"), int(port)


def rule_covers(rule_ports, number, names):
    """True when a NetworkPolicy rule's `ports` admit TCP port `number` (named `names`)."""
    if not rule_ports:
        return True
    for p in rule_ports:
        if p.get("protocol", "TCP") != "TCP":
            continue
        port = p.get("port")
        if port is None or port == number or port in names or \
                (isinstance(port, int) and isinstance(p.get("endPort"), int) and
                 port <= number <= p["endPort"]):
            return True
    return False


def admitted_peers(policies, number, names):
    """The peers the NetworkPolicies that select a pod admit to its port: a set
    of peers, {"*"} for every pod (also when no policy selects it)."""
    if not policies:
        return {"*"}
    peers = set()
    for pol in policies:
        for rule in (pol.get("spec") or {}).get("ingress") or []:
            if not rule_covers(rule.get("ports"), number, names):
                continue
            if not rule.get("from"):
                peers.add("*")
            for peer in rule.get("from") or []:
                peers.add(json.dumps(peer, sort_keys=True))
    return {"*"} if "*" in peers else peers


def peers_text(peers):
    if "*" in peers:
        return "every pod"
    return "; ".join(sorted(peers)) or "none"


def check_worker_ports(w, c, where, services, objects, problems):
    """The ports a worker listens on (gRPC, data, health, metrics) are declared;
    the ones readers dial are on its Service and advertised at the port they
    listen on; its data port is admitted from the same peers as its gRPC port
    and, under TLS, advertised at its gRPC host (README "TCP data ports")."""
    wc = f"{where} container {c.get('name', '?')}"
    text = daemon_line(command_text(c))
    env = container_env(c)
    declared = {p.get("containerPort"): p.get("name") for p in c.get("ports") or []
                if p.get("protocol", "TCP") == "TCP"}
    listen = flag(text, "listen")
    data_listen = flag(text, "data_listen")
    listen_hp = host_port(expand(listen or "", env))
    if data_listen is None and listen_hp and listen_hp[0] and not LOOPBACK.match(listen_hp[0]):
        problems.add(wc, "tessera-worker has no --data_listen: its data port is one the system "
                         "picks, which no containerPort, Service or NetworkPolicy can name (give "
                         "--data_listen=0.0.0.0:PORT, or off)")
    if data_listen == "off":
        data_listen = None
    ports = {}
    for name in ("listen", "data_listen", "health_listen", "metrics_listen"):
        hp = host_port(expand(flag(text, name) or "", env))
        if hp is None or not hp[0] or LOOPBACK.match(hp[0]) or (name == "data_listen" and
                                                                data_listen is None):
            continue
        ports[name] = hp[1]
        if hp[1] not in declared:
            problems.add(wc, f"--{name} port {hp[1]} is not a containerPort of the container")
    # What readers dial: on the Service that names the pods.
    if w.get("kind") == "StatefulSet":
        svcs = [services[n] for n in [(w.get("spec") or {}).get("serviceName")] if n in services]
    else:
        svcs = [s for s in services.values()
                if selects((s.get("spec") or {}).get("selector") or {}, pod_labels_of(w))]
    for name in ("listen", "data_listen"):
        number = ports.get(name)
        if number is None:
            continue
        for s in svcs:
            on = [sp for sp in (s.get("spec") or {}).get("ports") or []
                  if sp.get("protocol", "TCP") == "TCP" and
                  sp.get("targetPort", sp.get("port")) in (number, declared.get(number))]
            if not on:
                problems.add(wc, f"--{name} port {number} is on no port of Service "
                                 f"{(s.get('metadata') or {}).get('name')}, which lists what "
                                 "readers dial")
    for listen_flag, advertise_flag in (("listen", "advertise"), ("data_listen", "data_advertise")):
        value = flag(text, advertise_flag)
        hp = host_port(expand(value or "", env))
        number = ports.get(listen_flag)
        if hp is not None and number is not None and hp[1] != number:
            problems.add(wc, f"--{advertise_flag} port {hp[1]} is not --{listen_flag}'s port "
                             f"{number}: readers dial a port nothing listens on")
    # Under TLS a reader checks the data port's certificate against the host
    # of the data address: the gRPC name, which the worker's certificate names.
    data_advertise = flag(text, "data_advertise")
    if re.search(r"--tls_ca=", text) and data_listen is not None and data_advertise is not None:
        grpc_value = expand(flag(text, "advertise") or listen or "", env)
        data_value = expand(data_advertise, env)
        grpc_host = (host_port(grpc_value) or (grpc_value, 0))[0]
        data_host = (host_port(data_value) or (data_value, 0))[0]
        if data_host.lower() != grpc_host.lower():
            problems.add(wc, f"--data_advertise host {data_host} is not its --advertise host "
                             f"{grpc_host}: under TLS readers check the data port's certificate "
                             "against it; advertise the data port at the gRPC name, which the "
                             "worker's certificate names")
    # Readers that reach the gRPC port must reach the data port, and only they.
    if "listen" in ports and "data_listen" in ports:
        policies = selecting_policies([o for o in objects if o.get("kind") == "NetworkPolicy"],
                                      pod_labels_of(w))
        grpc = admitted_peers(policies, ports["listen"], {declared.get(ports["listen"])} - {None})
        data = admitted_peers(policies, ports["data_listen"],
                              {declared.get(ports["data_listen"])} - {None})
        if grpc != data:
            problems.add(where, f"the NetworkPolicies admit the data port {ports['data_listen']} "
                                f"from other peers than the gRPC port {ports['listen']} (gRPC: "
                                f"{peers_text(grpc)}; data: {peers_text(data)}): readers and "
                                "peer workers dial both")


def api_token_in(c, spec, service_accounts):
    """Why the container holds a Kubernetes API token, or None."""
    auto = spec.get("automountServiceAccountToken")
    if auto is None:
        sa = spec.get("serviceAccountName") or spec.get("serviceAccount") or "default"
        auto = (service_accounts.get(sa) or {}).get("automountServiceAccountToken")
    if auto is not False:
        return "its pod mounts the ServiceAccount's token (set automountServiceAccountToken: false)"
    token_volumes = {v.get("name") for v in spec.get("volumes") or []
                     if any("serviceAccountToken" in (src or {})
                            for src in (v.get("projected") or {}).get("sources") or [])}
    for m in c.get("volumeMounts") or []:
        if m.get("name") in token_volumes:
            return f"it mounts a ServiceAccount token (volume {m.get('name')})"
    return None


def check_rbac(objects, workloads, problems):
    """ServiceAccounts, roles and bindings refer to each other, and roles stay narrow."""
    accounts = {(o.get("metadata") or {}).get("name") for o in objects
                if o.get("kind") == "ServiceAccount"}
    roles = {(o.get("kind"), (o.get("metadata") or {}).get("name")) for o in objects
             if o.get("kind") in ("Role", "ClusterRole")}
    bound = set()
    for w in workloads:
        sa = (pod_spec_of(w) or {}).get("serviceAccountName")
        if sa and sa != "default" and sa not in accounts:
            problems.add(f"{w.get('kind')}/{(w.get('metadata') or {}).get('name')}",
                         f"serviceAccountName {sa!r} is not a ServiceAccount in the manifests")
    for o in objects:
        kind, name = o.get("kind"), (o.get("metadata") or {}).get("name")
        if kind in ("RoleBinding", "ClusterRoleBinding"):
            ref = o.get("roleRef") or {}
            target = (ref.get("kind"), ref.get("name"))
            bound.add(target)
            if target not in roles or (kind == "ClusterRoleBinding" and ref.get("kind") != "ClusterRole"):
                problems.add(f"{kind}/{name}", f"roleRef {ref.get('kind')}/{ref.get('name')} is not "
                                               f"a {'ClusterRole' if kind == 'ClusterRoleBinding' else 'Role or ClusterRole'} "
                                               "in the manifests")
            for subject in o.get("subjects") or []:
                if subject.get("kind") != "ServiceAccount":
                    continue
                if subject.get("name") not in accounts:
                    problems.add(f"{kind}/{name}", f"subject ServiceAccount {subject.get('name')!r} is "
                                                   "not a ServiceAccount in the manifests")
                if kind == "ClusterRoleBinding" and not subject.get("namespace"):
                    problems.add(f"{kind}/{name}", f"subject ServiceAccount {subject.get('name')!r} "
                                                   "has no namespace")
        if kind in ("Role", "ClusterRole"):
            for rule in o.get("rules") or []:
                for field in ("apiGroups", "resources", "verbs"):
                    if "*" in (rule.get(field) or []):
                        problems.add(f"{kind}/{name}", f"grants '*' in {field}: name what it needs")
    for kind, name in sorted(roles - bound):
        problems.add(f"{kind}/{name}", "no binding in the manifests grants it")


def selects(selector, labels):
    return bool(selector) and all(labels.get(k) == v for k, v in selector.items())


LOOPBACK = re.compile(r"^(127\.|localhost$|\[::1\]$)")


def metrics_ports(c):
    """The non-loopback metrics ports a container's daemon serves (tessera's
    --metrics_listen, etcd's --listen-metrics-urls), as (number, names) with
    the container port names that point at it."""
    words = " ".join(str(x) for x in (c.get("command") or []) + (c.get("args") or []))
    out = []
    found = [(m.group(1).rstrip(":"), int(m.group(2))) for m in
             re.finditer(r"--metrics_listen=(\S*?):?(\d+)(?=\s|$)", words)]
    found += [(m.group(1), int(m.group(2))) for m in
              re.finditer(r"--listen-metrics-urls=https?://([^\s:/,]+):(\d+)", words)]
    for host, port in found:
        if host and LOOPBACK.match(host):
            continue
        if not host:
            continue  # a port alone is loopback
        names = {p.get("name") for p in c.get("ports") or [] if p.get("containerPort") == port}
        out.append((port, names))
    return out


def check_metrics_policies(objects, workloads, problems):
    """Metrics are plaintext and unauthenticated: only named peers may reach them."""
    policies = [o for o in objects if o.get("kind") == "NetworkPolicy"]
    for w in workloads:
        where = f"{w.get('kind')}/{(w.get('metadata') or {}).get('name')}"
        labels = pod_labels_of(w)
        ports = [p for c in (pod_spec_of(w) or {}).get("containers") or [] for p in metrics_ports(c)]
        if not ports:
            continue
        selecting = []
        for pol in policies:
            spec = pol.get("spec") or {}
            sel = (spec.get("podSelector") or {}).get("matchLabels") or {}
            types = spec.get("policyTypes") or ["Ingress"]
            if "Ingress" in types and all(labels.get(k) == v for k, v in sel.items()):
                selecting.append(pol)
        for number, names in ports:
            if not selecting:
                problems.add(where, f"metrics port {number} is open to every pod: add a "
                                    "NetworkPolicy that admits only the scraper (networkpolicy.yaml)")
                continue
            for pol in selecting:
                pname = (pol.get("metadata") or {}).get("name")
                for rule in (pol.get("spec") or {}).get("ingress") or []:
                    rule_ports = rule.get("ports")
                    covers = not rule_ports or any(
                        p.get("port") is None or p.get("port") == number or p.get("port") in names
                        for p in rule_ports)
                    if covers and not rule.get("from"):
                        problems.add(f"NetworkPolicy/{pname}",
                                     f"admits every peer to the metrics port {number} of {where}; "
                                     "name the scraper in `from`")


def selector_matches(selector, labels):
    """A LabelSelector (matchLabels, matchExpressions) against labels; {} matches all."""
    if not all(labels.get(k) == v for k, v in (selector.get("matchLabels") or {}).items()):
        return False
    for e in selector.get("matchExpressions") or []:
        key, op, values = e.get("key"), e.get("operator"), e.get("values") or []
        if not {"In": key in labels and labels[key] in values,
                "NotIn": labels.get(key) not in values,
                "Exists": key in labels,
                "DoesNotExist": key not in labels}.get(op, False):
            return False
    return True


def check_service_monitors(objects, workloads, problems):
    """A ServiceMonitor (Prometheus Operator) selects a Service of the manifests
    by its labels, and each endpoint names a port of that Service that leads to
    a daemon's metrics port, at /metrics."""
    services = [o for o in objects if o.get("kind") == "Service"]
    for m in objects:
        if m.get("kind") != "ServiceMonitor" or \
                not str(m.get("apiVersion", "")).startswith("monitoring.coreos.com/"):
            continue
        where = f"ServiceMonitor/{(m.get('metadata') or {}).get('name')}"
        spec = m.get("spec") or {}
        selector = spec.get("selector") or {}
        selected = [s for s in services
                    if selector_matches(selector, (s.get("metadata") or {}).get("labels") or {})]
        if not selected:
            problems.add(where, f"selects no Service of the manifests (selector "
                                f"{json.dumps(selector, sort_keys=True)}): Prometheus scrapes "
                                "nothing; select the labels of the Service in front of the pods")
            continue
        endpoints = spec.get("endpoints") or []
        if not endpoints:
            problems.add(where, "has no endpoints: Prometheus scrapes nothing")
        for i, e in enumerate(endpoints):
            port = e.get("port")
            if not isinstance(port, str):
                problems.add(where, f"endpoints[{i}] names no Service port (port: NAME, the "
                                    "Service port's name)")
                continue
            if e.get("path", "/metrics") != "/metrics":
                problems.add(where, f"endpoints[{i}] path {e.get('path')}: the daemons serve "
                                    "metrics at /metrics")
            for s in selected:
                sname = (s.get("metadata") or {}).get("name")
                sports = (s.get("spec") or {}).get("ports") or []
                sp = next((p for p in sports if p.get("name") == port), None)
                if sp is None:
                    problems.add(where, f"endpoints[{i}] port {port!r} is no port of Service "
                                        f"{sname} (it has {sorted(str(p.get('name')) for p in sports)}): "
                                        "Prometheus finds no target there")
                    continue
                target = sp.get("targetPort", sp.get("port"))
                sel = (s.get("spec") or {}).get("selector") or {}
                pods = [w for w in workloads if selects(sel, pod_labels_of(w))]
                served = any(target == number or target in names
                             for w in pods for c in (pod_spec_of(w) or {}).get("containers") or []
                             for number, names in metrics_ports(c))
                if pods and not served:
                    problems.add(where, f"endpoints[{i}] port {port!r} of Service {sname} leads to "
                                        f"no metrics port (--metrics_listen) of its pods (targetPort "
                                        f"{target!r}): Prometheus would scrape another protocol")


def check_images(directory, problems):
    """Every image of the manifests is named by an `images:` entry, so that
    `kustomize edit set image` and an overlay's `images:` change them all."""
    kustomizations, docs = kustomize_sources(directory)
    entries = [e for k in kustomizations for e in k.get("images") or [] if isinstance(e, dict)]
    names = {e.get("name") for e in entries}
    used = set()
    for o in (o for o in docs if isinstance(o, dict)):
        where = f"{o.get('kind')}/{(o.get('metadata') or {}).get('name')}"
        for c in containers_of(o):
            image = str(c.get("image", ""))
            name = split_image(image)[0]
            used.add(name)
            if name not in names:
                problems.add(f"{where} container {c.get('name', '?')}",
                             f"image {image} is covered by no `images:` entry of "
                             f"kustomization.yaml (none is named {name}): `kustomize edit set "
                             "image` and an overlay's `images:` would leave it as it is")
    # An entry may also name what an entry before it renamed the image to.
    used |= {e.get("newName") for e in entries if e.get("newName")}
    for n in sorted(str(n) for n in names - used):
        problems.add(os.path.join(directory, "kustomization.yaml"),
                     f"`images:` entry {n!r} names no image of the manifests (they use "
                     f"{sorted(used)})")


def check_component_images(base, component, base_docs, rendered, problems):
    """A component's images: each is named by an `images:` entry (of the base
    or the component), and where the base's entry names it, the component's
    container has the image the base's containers have. kustomize applies a
    kustomization's `images:` to its own resources only: the base's entry
    never reaches a component's containers, which an overlay's `images:`
    (applied after its components) renames with the rest."""
    base_k, _ = kustomize_sources(base)
    comp_k, comp_docs = kustomize_sources(component)
    base_entries = [e for k in base_k for e in k.get("images") or [] if isinstance(e, dict)]
    names = {e.get("name") for k in base_k + comp_k for e in k.get("images") or []
             if isinstance(e, dict)}
    for o in (o for o in comp_docs if isinstance(o, dict)):
        where = f"{o.get('kind')}/{(o.get('metadata') or {}).get('name')}"
        for c in containers_of(o):
            image = str(c.get("image", ""))
            if split_image(image)[0] not in names:
                problems.add(f"{where} container {c.get('name', '?')}",
                             f"image {image} is covered by no `images:` entry (of the base or "
                             "the component): `kustomize edit set image` and an overlay's "
                             "`images:` would leave it as it is")
    renamed = {e.get("name") for e in base_entries}
    base_keys = {object_key(o) for o in base_docs}
    base_images = sorted({str(c.get("image", "")) for o in base_docs for c in containers_of(o)})
    for o in rendered:
        if object_key(o) in base_keys:
            continue
        where = f"{o.get('kind')}/{(o.get('metadata') or {}).get('name')}"
        for c in containers_of(o):
            image = str(c.get("image", ""))
            if split_image(image)[0] in renamed and image not in base_images:
                problems.add(f"{where} container {c.get('name', '?')}",
                             f"image {image} is not the base's ({', '.join(base_images)}): the "
                             "base's `images:` entry renames only the base's own containers; "
                             "set the image in the overlay's `images:`, which renames the "
                             "component's too")


# ---- the highly available coordinator and its etcd -----------------------------

ETCD = re.compile(r"(?:^|[\s/\"'])etcd(?:\s|$)")
DAY = 86400


def etcd_of(c):
    """True when the container starts etcd."""
    return ETCD.search(command_text(c)) is not None


def flag(text, name):
    """The value of --NAME=VALUE in text (quotes taken off), or None."""
    m = re.search(r"(?:^|\s)--" + re.escape(name) + r"=(\"[^\"]*\"|'[^']*'|\S+)", text)
    return m.group(1).strip("\"'") if m else None


def container_env(c):
    """The container's env values (not valueFrom), $(VAR) of earlier ones expanded."""
    env = {}
    for e in c.get("env") or []:
        if "value" in e:
            env[e.get("name")] = re.sub(r"\$\((\w+)\)", lambda m: env.get(m.group(1), m.group(0)),
                                        str(e["value"]))
    return env


def expand(word, env):
    """A shell word with $VAR and ${VAR} of the container's env put in."""
    return re.sub(r"\$\{?([A-Za-z_]\w*)\}?", lambda m: env.get(m.group(1), m.group(0)), word)


def pod_names(sts):
    """(pod, host prefix) of each replica of a StatefulSet: NAME-I and
    NAME-I.SERVICE, the per-pod DNS name under its headless Service."""
    name = (sts.get("metadata") or {}).get("name")
    svc = (sts.get("spec") or {}).get("serviceName")
    replicas = (sts.get("spec") or {}).get("replicas", 1)
    if not isinstance(replicas, int):
        return []
    return [(f"{name}-{i}", f"{name}-{i}.{svc}") for i in range(replicas)]


def names_host(addresses, prefix, port):
    """True when one of `addresses` (HOST:PORT) is the pod `prefix` (its name
    under the Service, short or qualified) on `port`."""
    for a in addresses:
        host, _, p = a.strip().rpartition(":")
        if (host == prefix or host.startswith(prefix + ".")) and p == str(port):
            return True
    return False


def port_in(text, pattern, default):
    """The port that `pattern` (a regex whose group 1 is the port) finds in text, or default."""
    m = re.search(pattern, text)
    return m.group(1) if m else str(default)


def network_probe(p):
    return bool(p) and any(k in p for k in ("grpc", "httpGet", "tcpSocket"))


def selecting_policies(policies, labels):
    out = []
    for pol in policies:
        spec = pol.get("spec") or {}
        sel = (spec.get("podSelector") or {}).get("matchLabels") or {}
        if "Ingress" in (spec.get("policyTypes") or ["Ingress"]) and \
                all(labels.get(k) == v for k, v in sel.items()):
            out.append(pol)
    return out


def check_headless(sts, services, where, who, unready, problems):
    """The StatefulSet's Service gives each pod a DNS name (`who` dial them by
    it), published while the pod is not ready (`unready` says why)."""
    svc_name = (sts.get("spec") or {}).get("serviceName")
    svc = services.get(svc_name)
    if svc is None:
        return  # check_rules says so
    spec = svc.get("spec") or {}
    if spec.get("clusterIP") != "None":
        problems.add(where, f"Service {svc_name} is not headless (clusterIP: None): {who} need "
                            "a DNS name per pod")
    if spec.get("publishNotReadyAddresses") is not True:
        problems.add(where, f"Service {svc_name} has no publishNotReadyAddresses: true: {unready}")


def check_etcd(sts, spec_c, services, objects, problems):
    """An etcd StatefulSet: a quorum that survives one loss, on persistent volumes."""
    where = f"StatefulSet/{(sts.get('metadata') or {}).get('name')}"
    spec = sts.get("spec") or {}
    text = command_text(spec_c)
    replicas = spec.get("replicas", 1)
    if not isinstance(replicas, int) or replicas < 3 or replicas % 2 == 0:
        problems.add(where, f"etcd runs {replicas} member(s): 3 (or 5) keep a quorum through the "
                            "loss of one (two)")
    data_dir = flag(text, "data-dir")
    claims = {(t.get("metadata") or {}).get("name") for t in spec.get("volumeClaimTemplates") or []}
    mounted = [m for m in spec_c.get("volumeMounts") or [] if m.get("name") in claims and data_dir and
               (data_dir + "/").startswith(str(m.get("mountPath", "")).rstrip("/") + "/")]
    if not mounted:
        problems.add(where, f"etcd's --data-dir ({data_dir}) is not on a PersistentVolumeClaim of "
                            "the StatefulSet (volumeClaimTemplates): a member rescheduled or "
                            "restarted loses its data")
    if spec.get("podManagementPolicy") != "Parallel":
        problems.add(where, "etcd without podManagementPolicy: Parallel: the first member is ready "
                            "only once a quorum runs, so the second is never started")
    check_headless(sts, services, where, "the members", "a member is ready only once a quorum "
                   "runs, and the members find each other by name before that", problems)
    initial = flag(text, "initial-cluster")
    members = dict(e.split("=", 1) for e in expand(initial or "", container_env(spec_c)).split(",")
                   if "=" in e)
    if initial is None:
        problems.add(where, "etcd has no --initial-cluster")
    else:
        for pod, prefix in pod_names(sts):
            url = members.get(pod, "")
            host = re.sub(r"^\w+://", "", url).rsplit(":", 1)[0]
            if host != prefix and not host.startswith(prefix + "."):
                problems.add(where, f"--initial-cluster does not name member {pod} at {prefix}")
        if isinstance(replicas, int) and len(members) != replicas:
            problems.add(where, f"--initial-cluster names {len(members)} member(s), the StatefulSet "
                                f"runs {replicas}")
    labels = pod_labels_of(sts)
    budgets = [o for o in objects if o.get("kind") == "PodDisruptionBudget" and
               selects(((o.get("spec") or {}).get("selector") or {}).get("matchLabels") or {}, labels)]
    if not budgets:
        problems.add(where, "no PodDisruptionBudget for etcd: a node drain may take two members "
                            "at once, and the quorum (maxUnavailable: 1)")
    for b in budgets:
        bs = b.get("spec") or {}
        if bs.get("maxUnavailable") != 1 and not (isinstance(replicas, int) and
                                                  bs.get("minAvailable") == replicas // 2 + 1):
            problems.add(f"PodDisruptionBudget/{(b.get('metadata') or {}).get('name')}",
                         "lets more than one etcd member go at once (maxUnavailable: 1)")


def urls(text, env, *names):
    """The URLs of etcd's --NAME=URL1,URL2 flags (an --initial-cluster's
    NAME=URL entries too), the container's env put in."""
    out = []
    for name in names:
        for u in expand(flag(text, name) or "", env).split(","):
            u = u.split("=", 1)[1] if "=" in u else u
            if u:
                out.append(u)
    return out


def switch(text, name):
    """True when the boolean flag --NAME (or --NAME=true) is in text."""
    return re.search(r"(?:^|\s)--" + re.escape(name) + r"(?:=true)?(?=[\s\\]|$)", text) is not None


CLIENT_URLS = ("listen-client-urls", "advertise-client-urls")
PEER_URLS = ("listen-peer-urls", "initial-advertise-peer-urls", "initial-cluster")


def etcd_client_tls(c):
    """(serves clients over TLS, requires client certificates) of an etcd container."""
    text, env = command_text(c), container_env(c)
    found = urls(text, env, *CLIENT_URLS)
    tls = bool(found) and all(u.startswith("https://") for u in found)
    return tls, tls and switch(text, "client-cert-auth")


def secrets_by_name(objects):
    return {(o.get("metadata") or {}).get("name"): o for o in objects if o.get("kind") == "Secret"}


def secret_file_problem(path, c, pod_spec, secrets):
    """Why the file `path` is not a key of a Secret mounted read-only in
    container c, or None. `secrets` are the Secrets checked (by name); when
    there are any, the Secret must be one and hold the key."""
    mounts = [m for m in c.get("volumeMounts") or []
              if path.startswith(str(m.get("mountPath", "")).rstrip("/") + "/")]
    if not mounts:
        return f"{path} is on no volume the container mounts (mount its Secret, read-only)"
    mount = max(mounts, key=lambda m: len(str(m.get("mountPath", ""))))
    name = mount.get("name")
    if mount.get("readOnly") is not True:
        return f"{path} is on volume {name!r}, mounted writable (readOnly: true)"
    volume = next((v for v in pod_spec.get("volumes") or [] if v.get("name") == name), {})
    rel = path[len(str(mount.get("mountPath", "")).rstrip("/")) + 1:]
    sources = [dict(volume["secret"], name=volume["secret"].get("secretName"))] \
        if isinstance(volume.get("secret"), dict) else \
        [src["secret"] for src in (volume.get("projected") or {}).get("sources") or []
         if isinstance((src or {}).get("secret"), dict)]
    if not sources:
        return f"{path} is on volume {name!r}, which is not a Secret (keys come from Secrets)"
    for src in sources:
        items = src.get("items")
        key = rel if items is None else next((i.get("key") for i in items if i.get("path") == rel),
                                             None)
        if key is None:
            continue
        if not secrets:
            return None
        secret = secrets.get(src.get("name"))
        if secret is None:
            return (f"{path} comes from Secret {src.get('name')!r}, which is not among the "
                    "Secrets checked (make-secrets.sh makes it, secrets.example.yaml shows it)")
        if key not in (secret.get("data") or {}) and key not in (secret.get("stringData") or {}):
            return f"{path} is key {key!r} of Secret {src.get('name')!r}, which has no such key"
        return None
    return f"{path} is no key of the Secret(s) on volume {name!r}"


def check_etcd_tls(sts, spec_c, cluster_tls, objects, problems):
    """etcd holds the cluster's secret: where the cluster runs TLS, its clients
    and peers speak TLS too, each showing a certificate of the CA it trusts,
    from a Secret; and the kubelet's probes ask a port they can pass on."""
    where = f"StatefulSet/{(sts.get('metadata') or {}).get('name')}"
    text, env = command_text(spec_c), container_env(spec_c)
    if cluster_tls:
        secrets = secrets_by_name(objects)
        for what, names, files, auth in (
                ("clients", CLIENT_URLS, ("cert-file", "key-file", "trusted-ca-file"),
                 "client-cert-auth"),
                ("peers", PEER_URLS, ("peer-cert-file", "peer-key-file", "peer-trusted-ca-file"),
                 "peer-client-cert-auth")):
            plain = [u for u in urls(text, env, *names) if not u.startswith("https://")]
            if plain:
                problems.add(where, f"etcd serves {what} over plaintext ({plain[0]}) while the "
                                    "cluster runs TLS: its prefix holds the cluster's secret (https "
                                    f"URLs with --{', --'.join(files)} and --{auth})")
            for f in files:
                value = flag(text, f)
                if value is None:
                    problems.add(where, f"etcd has no --{f}: it cannot speak TLS to its {what}")
                    continue
                why = secret_file_problem(expand(value, env), spec_c, pod_spec_of(sts) or {}, secrets)
                if why:
                    problems.add(where, f"etcd's --{f}: {why}")
            if not switch(text, auth):
                problems.add(where, f"etcd without --{auth}: whoever reaches its {what[:-1]} port "
                                    "gets in without a certificate of etcd's CA")
    client_tls, client_auth = etcd_client_tls(spec_c)
    if client_tls:
        port = int(port_in(text, r"--listen-client-urls=\S*?:(\d+)", 2379))
        names = {p.get("name") for p in spec_c.get("ports") or [] if p.get("containerPort") == port}
        for probe in ("startupProbe", "livenessProbe", "readinessProbe"):
            action = (spec_c.get(probe) or {}).get("httpGet") or {}
            if action and (action.get("port") == port or action.get("port") in names) and \
                    (client_auth or action.get("scheme", "HTTP") != "HTTPS"):
                problems.add(where, f"{probe} asks etcd's client port {port}, which speaks TLS"
                                    f"{' and wants a client certificate' if client_auth else ''}: "
                                    "the kubelet's probe cannot pass; ask the plaintext "
                                    "--listen-metrics-urls port (/health)")


def check_coordinator_etcd_tls(w, c, where, etcds, objects, problems):
    """A coordinator speaks to its etcd as etcd serves: TLS with etcd's CA and,
    under --client-cert-auth, a client certificate, each from a Secret."""
    text, env = daemon_line(command_text(c)), container_env(c)
    given = {f: flag(text, f) for f in ("etcd_ca", "etcd_cert", "etcd_key")}
    served = [etcd_client_tls(ec) for ec in etcds]
    if not served:
        return
    if not any(tls for tls, _ in served):
        if given["etcd_ca"] is not None:
            problems.add(where, "--etcd_ca speaks TLS to etcd, which serves plaintext: the "
                                "coordinator never connects")
        return
    need = ["etcd_ca"] + (["etcd_cert", "etcd_key"] if any(auth for _, auth in served) else [])
    secrets = secrets_by_name(objects)
    for f in need:
        if given[f] is None:
            problems.add(where, f"etcd serves TLS{' with --client-cert-auth' if len(need) > 1 else ''}"
                                f", and the coordinator has no --{f}: it cannot reach etcd")
    for f, value in given.items():
        if value is None:
            continue
        why = secret_file_problem(expand(value, env), c, pod_spec_of(w) or {}, secrets)
        if why:
            problems.add(where, f"--{f}: {why}")


def etcd_client_policy(sts, spec_c, coordinators, objects, problems):
    """etcd's client port holds the cluster's secret: only the coordinators."""
    where = f"StatefulSet/{(sts.get('metadata') or {}).get('name')}"
    port = int(port_in(command_text(spec_c), r"--listen-client-urls=\S*?:(\d+)", 2379))
    names = {p.get("name") for p in spec_c.get("ports") or [] if p.get("containerPort") == port}
    policies = selecting_policies([o for o in objects if o.get("kind") == "NetworkPolicy"],
                                  pod_labels_of(sts))
    if not policies:
        problems.add(where, f"etcd's client port {port} (the coordinators' secret is in it) is "
                            "open to every pod: add a NetworkPolicy that admits only the "
                            "coordinators")
        return
    admitted = False
    for pol in policies:
        pname = (pol.get("metadata") or {}).get("name")
        for rule in (pol.get("spec") or {}).get("ingress") or []:
            rule_ports = rule.get("ports")
            if rule_ports and not any(p.get("port") is None or p.get("port") == port or
                                      p.get("port") in names for p in rule_ports):
                continue
            if not rule.get("from"):
                problems.add(f"NetworkPolicy/{pname}", f"admits every peer to etcd's client port "
                                                       f"{port} of {where}; name the coordinators "
                                                       "in `from`")
                continue
            for peer in rule.get("from") or []:
                sel = (peer.get("podSelector") or {}).get("matchLabels")
                if sel and "namespaceSelector" not in peer and \
                        any(selects(sel, pod_labels_of(c)) for c in coordinators):
                    admitted = True
    if coordinators and not admitted:
        problems.add(where, f"no NetworkPolicy admits the coordinators to etcd's client port {port}")


def check_ha(objects, workloads, problems):
    """Coordinators with --metadata=etcd://... (CLI.md "Highly available coordinator"),
    their etcd, and the workers that must know every coordinator."""
    services = {(o.get("metadata") or {}).get("name"): o for o in objects if o.get("kind") == "Service"}
    etcds, coordinators, workers = [], [], []
    for w in workloads:
        for c in (pod_spec_of(w) or {}).get("containers") or []:
            if etcd_of(c):
                etcds.append((w, c))
            elif daemon_of(c) == "tessera-coordinator" and \
                    flag(daemon_line(command_text(c)), "metadata") is not None:
                coordinators.append((w, c))
            elif daemon_of(c) == "tessera-worker":
                workers.append((w, c))
    cluster_tls = any(daemon_of(c) and re.search(r"--tls_ca=", daemon_line(command_text(c)))
                      for w in workloads for c in (pod_spec_of(w) or {}).get("containers") or [])
    for w, c in etcds:
        if w.get("kind") != "StatefulSet":
            problems.add(f"{w.get('kind')}/{(w.get('metadata') or {}).get('name')}",
                         "etcd runs outside a StatefulSet: its members need stable names and "
                         "volumes")
            continue
        check_etcd(w, c, services, objects, problems)
        check_etcd_tls(w, c, cluster_tls, objects, problems)
        etcd_client_policy(w, c, [cw for cw, _ in coordinators], objects, problems)
    etcd_sets = [w for w, _ in etcds if w.get("kind") == "StatefulSet"]
    for w, c in coordinators:
        where = f"{w.get('kind')}/{(w.get('metadata') or {}).get('name')} container {c.get('name', '?')}"
        spec = w.get("spec") or {}
        text = daemon_line(command_text(c))
        env = container_env(c)
        if flag(text, "data_dir") is not None:
            problems.add(where, "tessera-coordinator has both --metadata and --data_dir (it refuses "
                                "to start)")
        metadata = flag(text, "metadata")
        m = re.match(r"etcd://([^/]+)/(.+)$", expand(metadata, env))
        if m is None:
            problems.add(where, f"--metadata={metadata} is not etcd://H1:P1,H2:P2,.../PREFIX")
        elif not etcd_sets:
            problems.add(where, "--metadata names etcd, but no etcd StatefulSet is in the manifests")
        else:
            endpoints = m.group(1).split(",")
            for e in etcd_sets:
                ec = next(ec for ew, ec in etcds if ew is e)
                port = port_in(command_text(ec), r"--listen-client-urls=\S*?:(\d+)", 2379)
                for pod, prefix in pod_names(e):
                    if not names_host(endpoints, prefix, port):
                        problems.add(where, f"--metadata does not name etcd member {pod} "
                                            f"({prefix}:{port}): the coordinators lose etcd when "
                                            "the members they know are down")
            check_coordinator_etcd_tls(w, c, where, [ec for ew, ec in etcds if ew in etcd_sets],
                                       objects, problems)
        if w.get("kind") != "StatefulSet" or not isinstance(spec.get("replicas", 1), int) or \
                spec.get("replicas", 1) < 2:
            problems.add(where, "one coordinator with --metadata is not highly available: a "
                                "StatefulSet of 2 or more (each with its own DNS name)")
            continue
        check_headless(w, services, where, "the workers and clients", "a standby is not ready, "
                       "and its name must resolve the moment it takes over", problems)
        advertise = flag(text, "advertise")
        name_vars = {e.get("name") for e in c.get("env") or []
                     if (((e.get("valueFrom") or {}).get("fieldRef") or {}).get("fieldPath")
                         == "metadata.name")}
        value = expand(advertise or "", env)
        if advertise is None or not any(re.search(r"\$[({]?" + re.escape(v) + r"\b", value)
                                        for v in name_vars):
            problems.add(where, "--advertise is not the pod's own name (downward API "
                                "metadata.name): the coordinators share one configuration, and "
                                "each must tell where it is reached")
        probes = {k: c.get(k) for k in ("startupProbe", "livenessProbe", "readinessProbe")}
        if network_probe(probes["livenessProbe"]) or network_probe(probes["readinessProbe"]):
            sp = probes["startupProbe"] or {}
            waits = sp.get("failureThreshold", 3) * sp.get("periodSeconds", 10) \
                if network_probe(sp) else 0
            asks_liveness = ((sp.get("grpc") or {}).get("service") == "liveness")
            if network_probe(probes["livenessProbe"]) and not asks_liveness and waits < DAY:
                problems.add(where, "a standby coordinator is never ready: a startupProbe that "
                                    "asks readiness never passes, and the livenessProbe restarts "
                                    "it; the startupProbe asks grpc service liveness")
            if (spec.get("updateStrategy") or {}).get("type") != "OnDelete":
                problems.add(where, "a standby coordinator is never ready, and a rolling update "
                                    "waits for each updated pod to be: updateStrategy OnDelete")
            for b in objects:
                if b.get("kind") == "PodDisruptionBudget" and selects(
                        ((b.get("spec") or {}).get("selector") or {}).get("matchLabels") or {},
                        pod_labels_of(w)):
                    problems.add(f"PodDisruptionBudget/{(b.get('metadata') or {}).get('name')}",
                                 "covers the coordinators, of which only the leader is ready: it "
                                 "forbids evicting the leader, and node drains hang")
    for w, c in workers:
        where = f"{w.get('kind')}/{(w.get('metadata') or {}).get('name')} container {c.get('name', '?')}"
        env = container_env(c)
        texts = [command_text(c)] + [" ".join(str(x) for x in (((c.get("lifecycle") or {}).get(h) or {})
                                                             .get("exec") or {}).get("command") or [])
                                     for h in ("preStop", "postStart")]
        given = list(dict.fromkeys(expand(v.strip("\"'"), env) for t in texts
                                   for v in re.findall(r"--coordinator=(\"[^\"]*\"|'[^']*'|\S+)", t)))
        if coordinators and flag(daemon_line(command_text(c)), "coordinator") is None:
            problems.add(where, "tessera-worker has no --coordinator: it looks for one on "
                                "127.0.0.1:7070 (give every coordinator)")
        for cw, cc in coordinators:
            port = port_in(daemon_line(command_text(cc)), r"--listen=\S*?:(\d+)", 7070)
            for value in given:
                for pod, prefix in pod_names(cw):
                    if not names_host(value.split(","), prefix, port):
                        problems.add(where, f"--coordinator={value} does not name coordinator "
                                            f"{pod} ({prefix}:{port}): when it leads, this "
                                            "worker (or its drain) cannot find it")


def check_rules(objects, problems):
    secrets = secret_values(objects)
    workloads = [o for o in objects if o.get("kind") in WORKLOAD_KINDS]
    services = {(o.get("metadata") or {}).get("name"): o for o in objects if o.get("kind") == "Service"}
    accounts = {(o.get("metadata") or {}).get("name"): o for o in objects
                if o.get("kind") == "ServiceAccount"}
    for o in workloads:
        where = f"{o.get('kind')}/{(o.get('metadata') or {}).get('name')}"
        spec = pod_spec_of(o) or {}
        pod_sc = spec.get("securityContext") or {}
        if not spec.get("containers"):
            problems.add(where, "no containers")
        for c in spec.get("initContainers") or []:
            check_container(dict(c, _init=True), pod_sc, where, secrets, problems)
        for c in spec.get("containers") or []:
            check_container(c, pod_sc, where, secrets, problems)
            daemon = daemon_of(c)
            if daemon is None:
                continue
            why = api_token_in(c, spec, accounts)
            if why:
                problems.add(f"{where} container {c.get('name', '?')}",
                             f"{daemon} can reach the Kubernetes API: {why}")
            if daemon == "tessera-worker":
                check_worker(c, spec, where, problems)
                check_worker_ports(o, c, where, services, objects, problems)
                check_labels(c, where, problems)
        if o.get("kind") == "StatefulSet":
            svc = (o.get("spec") or {}).get("serviceName")
            if svc not in services:
                problems.add(where, f"serviceName {svc!r} is not a Service in the manifests")
        if o.get("kind") == "DaemonSet":
            check_daemonset(o, where, problems)
        if o.get("kind") in ("StatefulSet", "DaemonSet", "Deployment", "ReplicaSet"):
            sel = ((o.get("spec") or {}).get("selector") or {}).get("matchLabels") or {}
            if not selects(sel, pod_labels_of(o)):
                problems.add(where, "spec.selector does not match the pod template's labels")
    for o in objects:
        kind, name = o.get("kind"), (o.get("metadata") or {}).get("name")
        if kind == "Service":
            sel = (o.get("spec") or {}).get("selector") or {}
            targets = [w for w in workloads if selects(sel, pod_labels_of(w))]
            if not targets:
                problems.add(f"Service/{name}", "its selector matches no workload")
            names = {p.get("name") for w in targets for c in (pod_spec_of(w) or {}).get("containers") or []
                     for p in c.get("ports") or []}
            for p in (o.get("spec") or {}).get("ports") or []:
                t = p.get("targetPort")
                if isinstance(t, str) and targets and t not in names:
                    problems.add(f"Service/{name}", f"targetPort {t!r} is no container port name")
        if kind == "PodDisruptionBudget":
            sel = ((o.get("spec") or {}).get("selector") or {}).get("matchLabels") or {}
            if not any(selects(sel, pod_labels_of(w)) for w in workloads):
                problems.add(f"PodDisruptionBudget/{name}", "its selector matches no workload")
        if kind == "NetworkPolicy":
            sel = (((o.get("spec") or {}).get("podSelector") or {}).get("matchLabels")) or {}
            if not any(selects(sel, pod_labels_of(w)) for w in workloads):
                problems.add(f"NetworkPolicy/{name}", "its podSelector matches no workload")
    check_metrics_policies(objects, workloads, problems)
    check_service_monitors(objects, workloads, problems)
    check_ha(objects, workloads, problems)
    check_rbac(objects, workloads, problems)
    return workloads


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("paths", nargs="*")
    ap.add_argument("--renderer", choices=("auto", "kubectl", "builtin"), default="auto")
    args = ap.parse_args(argv)
    paths = args.paths or [HERE, os.path.join(HERE, "secrets.example.yaml")]

    problems = Problems()
    objects, bases = [], []
    for p in paths:
        try:
            docs = render(p, args.renderer, problems)
        except (OSError, ValueError, yaml.YAMLError) as e:
            problems.add(p, f"cannot render: {e}")
            continue
        mine = []
        for i, d in enumerate(docs):
            if not isinstance(d, dict):
                problems.add(f"{p}[{i}]", "not a Kubernetes object")
                continue
            objects.append(d)
            mine.append(d)
        if os.path.isdir(p):
            bases.append((p, mine))
            try:
                check_images(p, problems)
            except (OSError, ValueError, yaml.YAMLError) as e:
                problems.add(p, f"cannot read its manifests for their images: {e}")
    for o in objects:
        validate_schema(o, f"{o.get('kind')}/{(o.get('metadata') or {}).get('name')}", problems)
    workloads = check_rules(objects, problems)

    # A base's optional components, each rendered onto it: what one adds or
    # changes is checked with the rest; the base itself needs no CRD.
    with_components = []
    for p, docs in bases:
        components = components_of(p)
        labels = [os.path.relpath(c, p) for c in components]
        for o in docs:
            if components and (o.get("apiVersion"), o.get("kind")) in CRD_KINDS:
                problems.add(f"{o.get('kind')}/{(o.get('metadata') or {}).get('name')}",
                             f"is in the base {p}, which then applies only where the CRD of "
                             f"{o.get('apiVersion')} {o.get('kind')} is installed: keep it in a "
                             f"component ({', '.join(labels)})")
        others = [o for o in objects if not any(o is d for d in docs)]
        base = {object_key(o): o for o in docs}
        for component, label in zip(components, labels):
            try:
                rendered = render_with_component(p, component, args.renderer, problems, label)
            except (OSError, ValueError, yaml.YAMLError) as e:
                problems.add(label, f"cannot render the base with it: {e}")
                continue
            rendered = [o for o in rendered if isinstance(o, dict)]
            changed = [o for o in rendered if base.get(object_key(o)) != o]
            with_components.append(f"{label}: {len(changed)} objects")
            sub = Problems()
            for o in changed:
                validate_schema(o, f"{o.get('kind')}/{(o.get('metadata') or {}).get('name')}", sub)
            check_rules(rendered + others, sub)
            try:
                check_component_images(p, component, docs, rendered, sub)
            except (OSError, ValueError, yaml.YAMLError) as e:
                sub.add(label, f"cannot read its manifests for their images: {e}")
            seen = set(problems.items)
            for item in sub.items:
                if item not in seen:
                    problems.add(f"with {label}", item)

    for line in problems.items:
        print(f"  FAIL {line}")
    n = len(problems.items)
    print(f"k8s check: {len(objects)} objects ({len(workloads)} workloads)"
          f"{''.join(', ' + w for w in with_components)}, "
          f"{n} problem{'s' if n != 1 else ''}{'' if n else ': ok'}")
    return 1 if n else 0


if __name__ == "__main__":
    sys.exit(main())
