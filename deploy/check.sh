#!/usr/bin/env bash
# Checks everything under deploy/ that can be checked without a cluster or an image build:
#
#   - every Kubernetes manifest in deploy/k8s against the API schemas of Kubernetes 1.29
#     to 1.33, strictly (an unknown field fails), with kubernetes-validate from PyPI;
#   - what no schema says: selectors, port names, Secrets, HAWSER_JOIN and image tags
#     agree between the objects (the PodMonitor, a Prometheus Operator resource with no
#     built-in schema, is checked here only);
#   - the Prometheus rules with promtool: `check rules`, then the unit tests in
#     deploy/prometheus/hawser-alerts.test.yaml.
#
# Runs as root on Debian bookworm with python3 and apt; installs, under a cache directory
# (DEPLOY_CHECK_CACHE, default ~/.cache/hawser-deploy-check), a virtualenv with pinned
# kubernetes-validate and promtool taken out of Debian's prometheus package (the binary
# only: installing the package would also set up a Prometheus server service). Exits
# non-zero on any failure. The Dockerfile is not built here.
set -euo pipefail
cd "$(dirname "$0")/.."

cache=${DEPLOY_CHECK_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/hawser-deploy-check}
k8s_versions=(1.29.0 1.30.0 1.31.0 1.32.0 1.33.0)
mkdir -p "$cache"

# --- kubernetes-validate, pinned with its dependencies ------------------------------
venv=$cache/venv
pins=$cache/requirements.txt
cat >"$pins.new" <<'EOF'
kubernetes-validate==1.34.1
attrs==26.1.0
importlib_resources==7.1.0
jsonschema==4.26.0
jsonschema-specifications==2025.9.1
packaging==26.4
PyYAML==6.0.4
referencing==0.37.0
rpds-py==2026.9.1
typing_extensions==4.16.0
EOF
if [[ ! -x $venv/bin/python ]] || ! cmp -s "$pins.new" "$pins"; then
    echo "== installing kubernetes-validate into $venv"
    rm -rf "$venv"
    if ! python3 -m venv "$venv" 2>/dev/null; then
        # Debian keeps venv's pip bootstrap in a package of its own.
        apt-get update -qq
        DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends python3-venv >/dev/null
        rm -rf "$venv"
        python3 -m venv "$venv"
    fi
    "$venv/bin/pip" install --quiet --disable-pip-version-check -r "$pins.new"
    mv "$pins.new" "$pins"
else
    rm -f "$pins.new"
fi

# --- promtool ----------------------------------------------------------------------
promtool=$cache/prometheus/usr/bin/promtool
if [[ ! -x $promtool ]]; then
    echo "== fetching promtool from Debian's prometheus package"
    dl=$(mktemp -d)
    trap 'rm -rf "$dl"' EXIT
    if ! (cd "$dl" && apt-get download prometheus >/dev/null 2>&1); then
        apt-get update -qq
        (cd "$dl" && apt-get download prometheus >/dev/null)
    fi
    rm -rf "$cache/prometheus"
    dpkg-deb -x "$dl"/prometheus_*.deb "$cache/prometheus"
fi

# --- manifests ---------------------------------------------------------------------
echo "== Kubernetes manifests (kubernetes-validate $("$venv/bin/pip" show kubernetes-validate | sed -n 's/^Version: //p'), strict)"
"$venv/bin/python" - "${k8s_versions[@]}" <<'EOF'
import glob, sys, tomllib
from kubernetes_validate import utils as kv

versions = sys.argv[1:]
# Resource kinds of operators, which have no built-in schema: checked below instead.
crd_groups = {"monitoring.coreos.com"}
failures = []

def fail(msg):
    failures.append(msg)
    print("FAIL", msg)

files = sorted(glob.glob("deploy/k8s/**/*.yaml", recursive=True))
if not files:
    fail("no manifests under deploy/k8s")
objects = []
for f in files:
    for doc in kv.resources_from_file(f):
        if not doc:
            continue
        objects.append((f, doc))
        what = f"{f}: {doc['kind']}/{doc['metadata']['name']}"
        if doc["apiVersion"].split("/")[0] in crd_groups:
            print(f"  {what}: no schema ({doc['apiVersion']} is a custom resource); cross-checked only")
            continue
        for v in versions:
            try:
                kv.validate(doc, v, strict=True)
            except kv.ValidationError as e:
                fail(f"{what} against {v}: {'.'.join(map(str, e.path))}: {e.message}")
            except kv.SchemaNotFoundError as e:
                fail(f"{what}: no schema in {v}: {e}")
        print(f"  {what}: valid for {', '.join(v.rsplit('.', 1)[0] for v in versions)}")

# --- what the schemas cannot see: the objects agree with each other -----------------
def one(kind):
    found = [d for _, d in objects if d["kind"] == kind]
    if len(found) != 1:
        fail(f"expected one {kind}, found {len(found)}")
        return {}
    return found[0]

def matches(selector, labels):
    return all(labels.get(k) == v for k, v in selector.items())

sts = one("StatefulSet")
spec = sts.get("spec", {})
pod = spec.get("template", {})
labels = pod.get("metadata", {}).get("labels", {})
container = pod.get("spec", {}).get("containers", [{}])[0]
ports = {p["name"]: p["containerPort"] for p in container.get("ports", [])}
env = {e["name"]: e.get("value") for e in container.get("env", [])}
mounts = {m["name"]: m["mountPath"] for m in container.get("volumeMounts", [])}
secrets = {v["name"]: v["secret"]["secretName"]
           for v in pod.get("spec", {}).get("volumes", []) if "secret" in v}
name, replicas = sts["metadata"]["name"], spec.get("replicas")

services = {d["metadata"]["name"]: d for _, d in objects if d["kind"] == "Service"}
headless = services.get(spec.get("serviceName"), {}).get("spec", {})
if headless.get("clusterIP") != "None" or not headless.get("publishNotReadyAddresses"):
    fail(f"serviceName {spec.get('serviceName')} must be a headless Service publishing not-ready pods")
for svc in services.values():
    s = svc["spec"]
    if not matches(s["selector"], labels):
        fail(f"Service {svc['metadata']['name']} selects no StatefulSet pod")
    for p in s["ports"]:
        target = p.get("targetPort", p["port"])
        if target not in ports and target not in ports.values():
            fail(f"Service {svc['metadata']['name']} targets port {target}, not a container port")
client = services.get("hawser-client", {}).get("spec", {})
if client.get("publishNotReadyAddresses") or client.get("clusterIP") == "None":
    fail("hawser-client must be a ClusterIP Service of ready pods")
if not matches(one("PodDisruptionBudget").get("spec", {}).get("selector", {}).get("matchLabels", {"-": "-"}), labels):
    fail("the PodDisruptionBudget selects no StatefulSet pod")

want_join = ",".join(f"{name}-{i}.{spec.get('serviceName')}:{ports.get('grpc')}" for i in range(replicas or 0))
if env.get("HAWSER_JOIN") != want_join:
    fail(f"HAWSER_JOIN is {env.get('HAWSER_JOIN')!r}, want every pod: {want_join!r}")
certs_dir = env.get("HAWSER_CERTS_DIR")
if certs_dir not in mounts.values() or "HAWSER_INSECURE" in env:
    fail("the nodes must run with HAWSER_CERTS_DIR on the certificates volume, not insecure")

version = tomllib.load(open("Cargo.toml", "rb"))["workspace"]["package"]["version"]
for f, d in objects:
    tmpl = d.get("spec", {}).get("template", {}).get("spec", {})
    for c in tmpl.get("containers", []):
        if c["image"].rsplit("/", 1)[-1] != f"hawser:{version}":
            fail(f"{f}: {d['kind']}/{d['metadata']['name']} runs {c['image']}, not hawser:{version}")
    if d["kind"] == "Job":
        job_labels = d["spec"]["template"].get("metadata", {}).get("labels", {})
        if any(matches(svc["spec"]["selector"], job_labels) for svc in services.values()):
            fail(f"Job {d['metadata']['name']}'s pods carry the nodes' labels")
        jsecrets = {v["secret"]["secretName"] for v in tmpl.get("volumes", []) if "secret" in v}
        if jsecrets != set(secrets.values()):
            fail(f"Job {d['metadata']['name']} mounts {jsecrets}, the nodes {set(secrets.values())}")

for f, d in objects:
    if d["kind"] != "PodMonitor":
        continue
    s = d.get("spec", {})
    if d["apiVersion"] != "monitoring.coreos.com/v1" or not matches(s.get("selector", {}).get("matchLabels", {"-": "-"}), labels):
        fail(f"{f}: the PodMonitor selects no StatefulSet pod")
    if labels.get(s.get("jobLabel")) != "hawser":
        fail(f"{f}: jobLabel must give job=\"hawser\" (the alerting rules' job)")
    allowed = {"port", "path", "scheme", "interval", "tlsConfig", "authorization"}
    for ep in s.get("podMetricsEndpoints", []):
        if set(ep) - allowed:
            fail(f"{f}: unexpected endpoint fields {sorted(set(ep) - allowed)}")
        if ep.get("port") not in ports or ep.get("scheme") != "https":
            fail(f"{f}: must scrape the container port http over https")
        if ep.get("tlsConfig", {}).get("ca", {}).get("secret", {}).get("name") not in secrets.values():
            fail(f"{f}: the CA must come from the nodes' certificates Secret")
        cred = ep.get("authorization", {}).get("credentials", {})
        if ep.get("authorization", {}).get("type") != "Bearer" or not cred.get("name") or not cred.get("key"):
            fail(f"{f}: needs a Bearer token from a Secret")
print(f"  cross-checks: selectors, ports, Secrets, HAWSER_JOIN ({replicas} pods), images hawser:{version}")
sys.exit(1 if failures else 0)
EOF

# --- Prometheus rules --------------------------------------------------------------
echo "== Prometheus rules ($("$promtool" --version 2>&1 | head -1))"
"$promtool" check rules deploy/prometheus/hawser-alerts.yaml
"$promtool" test rules deploy/prometheus/hawser-alerts.test.yaml
echo "== deploy/ checks passed"
