#!/usr/bin/env bash
# kpm check of a kubelet plugin in a CI job (docs/plugin-authors.md, "A CI job to copy").
#
#   kpm-check.sh [--cluster BIN_DIR] [--crd FILE]... OUT [KPM-CHECK-OPTION...] -- COMMAND...
#
# Runs `kpm check --junit OUT/kpm-check.xml KPM-CHECK-OPTION... -- COMMAND...`, shows its
# report and keeps it in OUT/kpm-check.out, and exits as kpm check does (1: a check failed).
# A step of its own that fails names itself and exits 2.
#
#   --cluster BIN_DIR  first etcd and kube-apiserver from BIN_DIR on loopback (a DRA driver,
#                      or any driver that reads the API server): a CA and serving certificate
#                      (openssl), a static admin token, RBAC, Node $NODE; kpm check gets
#                      --kubeconfig OUT/cluster/kubeconfig --node-name $NODE; their logs in
#                      OUT/cluster.
#   --crd FILE         a CustomResourceDefinition the driver needs, created before the check.
#
# Environment: KPM, the kpm binary (default: kpm on PATH); or KPM_IMAGE, kpm's image, run with
# KPM_RUNTIME (docker, the default, podman or ctr) on the host's network, with OUT, the
# command's program's directory and each of KPM_MOUNTS (space-separated) mounted at their
# own paths. NODE (node1), ETCD_PORT (2379), ETCD_PEER_PORT (2380), APISERVER_PORT (6443).
set -euo pipefail

fail() { echo "kpm-check.sh: $*" >&2; exit 2; }

bin_dir='' crds=()
while [ $# -gt 0 ]; do
  case $1 in
    --cluster) [ $# -ge 2 ] || fail "--cluster needs a directory"; bin_dir=$2; shift 2 ;;
    --crd) [ $# -ge 2 ] || fail "--crd needs a file"; crds+=("$2"); shift 2 ;;
    *) break ;;
  esac
done
[ $# -ge 3 ] || fail "usage: kpm-check.sh [--cluster BIN_DIR] [--crd FILE]... OUT [OPTION...] -- COMMAND..."
mkdir -p "$1" || fail "cannot make $1"
out=$(cd "$1" && pwd)
shift
# An earlier run's report would pass for this one's.
rm -f "$out/kpm-check.xml" "$out/kpm-check.out"
node=${NODE:-node1}
options=()
while [ $# -gt 0 ] && [ "$1" != -- ]; do options+=("$1"); shift; done
[ $# -ge 2 ] || fail "no command after --"
shift
pids=()
# A throwaway cluster: killed, kube-apiserver before etcd (without etcd it takes minutes to stop).
c=''
trap 'for ((i = ${#pids[@]} - 1; i >= 0; i--)); do kill -KILL "${pids[i]}" 2>/dev/null || true; done
  wait 2> /dev/null; [ -z "$c" ] || rm -rf "$c"' EXIT

# Polls `$2...` every half second until it succeeds; after 60 s fails naming $1.
wait_for() {
  local what=$1; shift
  for _ in $(seq 120); do "$@" > /dev/null 2>&1 && return 0; sleep 0.5; done
  fail "$what within 60 s"
}

if [ -n "$bin_dir" ]; then
  for program in etcd kube-apiserver; do
    [ -x "$bin_dir/$program" ] || fail "--cluster: no $program in $bin_dir"
  done
  # Logs and the kubeconfig in OUT/cluster; keys and etcd's data in a dir that goes with the run.
  logs=$out/cluster c=$(mktemp -d)
  rm -rf "$logs" && mkdir -p "$logs" && cd "$c" || fail "cannot make $logs or $c"
  {
    openssl req -x509 -newkey rsa:2048 -nodes -days 1 -subj /CN=kpm-check-ca -keyout ca.key -out ca.crt &&
      openssl req -newkey rsa:2048 -nodes -subj /CN=kube-apiserver -keyout apiserver.key -out apiserver.csr &&
      echo 'subjectAltName=IP:127.0.0.1,DNS:localhost' > san.ext &&
      openssl x509 -req -in apiserver.csr -CA ca.crt -CAkey ca.key -CAcreateserial -days 1 \
        -extfile san.ext -out apiserver.crt &&
      openssl genrsa -out sa.key 2048 && openssl rsa -in sa.key -pubout -out sa.pub
  } > "$logs/openssl.log" 2>&1 || fail "certificates: openssl failed, see $logs/openssl.log"
  # A loopback-only token, gone with the run.
  token=$(od -An -N16 -tx1 /dev/urandom | tr -d ' \n')
  echo "$token,admin,admin,\"system:masters\"" > tokens.csv
  etcd_url=http://127.0.0.1:${ETCD_PORT:-2379}
  "$bin_dir/etcd" --data-dir etcd --listen-client-urls "$etcd_url" --advertise-client-urls "$etcd_url" \
    --listen-peer-urls "http://127.0.0.1:${ETCD_PEER_PORT:-2380}" > "$logs/etcd.log" 2>&1 &
  pids+=($!)
  etcd_healthy() { curl -fsS "$etcd_url/health" | grep '"health":"true"'; }
  wait_for "etcd healthy, see $logs/etcd.log" etcd_healthy
  server=https://127.0.0.1:${APISERVER_PORT:-6443}
  "$bin_dir/kube-apiserver" --etcd-servers "$etcd_url" --bind-address 127.0.0.1 \
    --secure-port "${APISERVER_PORT:-6443}" --tls-cert-file apiserver.crt \
    --tls-private-key-file apiserver.key --token-auth-file tokens.csv --authorization-mode RBAC \
    --service-account-issuer https://kubernetes.default.svc --service-account-key-file sa.pub \
    --service-account-signing-key-file sa.key --service-cluster-ip-range 10.0.0.0/24 \
    --endpoint-reconciler-type none --disable-admission-plugins ServiceAccount \
    > "$logs/kube-apiserver.log" 2>&1 &
  pids+=($!)
  # Not curl's user agent, which the API server answers with pretty (multi-line) JSON.
  api() { curl -fsS -A kpm-check.sh --cacert "$c/ca.crt" -H "Authorization: Bearer $token" "$@"; }
  wait_for "kube-apiserver ready, see $logs/kube-apiserver.log" api "$server/readyz"
  cat > "$logs/kubeconfig" <<EOF
apiVersion: v1
kind: Config
clusters: [{name: kpm-check, cluster: {server: "$server", certificate-authority-data: $(base64 -w0 ca.crt)}}]
users: [{name: admin, user: {token: "$token"}}]
contexts: [{name: kpm-check, context: {cluster: kpm-check, user: admin}}]
current-context: kpm-check
EOF
  # As the kubelet registers its Node: the DRA helper owns its ResourceSlices by it.
  api -H 'Content-Type: application/json' -o /dev/null "$server/api/v1/nodes" -d \
    "{\"apiVersion\":\"v1\",\"kind\":\"Node\",\"metadata\":{\"name\":\"$node\",\"labels\":{\"kubernetes.io/hostname\":\"$node\"}}}" \
    || fail "Node $node: POST refused, see $logs/kube-apiserver.log"
  crd_path=$server/apis/apiextensions.k8s.io/v1/customresourcedefinitions
  for crd in "${crds[@]}"; do
    name=$(api -H 'Content-Type: application/yaml' --data-binary "@$crd" "$crd_path" |
      sed -n 's/^{"kind":"CustomResourceDefinition","apiVersion":"[^"]*","metadata":{"name":"\([^"]*\)".*/\1/p') ||
      fail "CRD $crd: POST refused"
    [ -n "$name" ] || fail "CRD $crd: no name in the API server's answer"
    established() { api "$crd_path/$name" | grep '"type":"Established","status":"True"'; }
    wait_for "CRD $name established" established
  done
  cd - > /dev/null
  options=(--kubeconfig "$logs/kubeconfig" --node-name "$node" "${options[@]}")
fi

check=(check --junit "$out/kpm-check.xml" "${options[@]}" -- "$@")
if [ -z "${KPM_IMAGE:-}" ]; then
  run=("${KPM:-kpm}" "${check[@]}")
else
  mounts=() program=$(dirname "$(command -v "$1" || echo "$1")")
  for dir in "$out" "$program" ${KPM_MOUNTS:-}; do
    case ${KPM_RUNTIME:-docker} in
      ctr) mounts+=(--mount "type=bind,src=$dir,dst=$dir,options=rbind:rw") ;;
      *) mounts+=(-v "$dir:$dir") ;;
    esac
  done
  case ${KPM_RUNTIME:-docker} in
    ctr) run=(ctr run --rm --net-host "${mounts[@]}" "$KPM_IMAGE" "kpm-check-$$" /usr/local/bin/kpm "${check[@]}") ;;
    *) run=("${KPM_RUNTIME:-docker}" run --rm --network host "${mounts[@]}" "$KPM_IMAGE" "${check[@]}") ;;
  esac
fi
status=0
"${run[@]}" | tee "$out/kpm-check.out" || status=$?
[ -s "$out/kpm-check.xml" ] || fail "${run[0]} wrote no $out/kpm-check.xml (exit $status)"
exit "$status"
