#!/bin/bash
# istio-start.sh: configure traffic capture on this machine and start the Istio agent (pilot-agent proxy).
#
# What the istio.service unit runs (ExecStart; `istio-start.sh clean` as ExecStopPost). Settings come
# from sidecar.env (this machine's own) and cluster.env (the onboarding file `istiod-local workload-entry
# configure` writes), both read with every variable exported so that `pilot-agent istio-iptables` and the
# agent see them: ISTIO_INBOUND_PORTS, ISTIO_LOCAL_EXCLUDE_PORTS, ISTIO_SERVICE_CIDR,
# ISTIO_INBOUND_INTERCEPTION_MODE, ISTIO_META_DNS_CAPTURE and the rest are the capture flags' own
# environment variables, so the capture is derived by istio-iptables itself.
#
# Arguments: none (clean, apply capture, run the agent); `clean` (remove the capture and stop);
# `init` or `-p ...` (clean and apply capture with these istio-iptables arguments, then stop);
# `run` (start the agent without touching capture).
#
# pilot-agent is looked for in $ISTIO_BIN_BASE (default /usr/local/bin), then in the package's venv
# ($ISTIO_AGENT_HOME/bin, default /usr/local/lib/istio-agent), then on PATH.
set -ea

ISTIO_SIDECAR_CONFIG=${ISTIO_SIDECAR_CONFIG:-./var/lib/istio/envoy/sidecar.env}
if [[ -r ${ISTIO_SIDECAR_CONFIG} ]]; then
  # shellcheck disable=SC1090
  . "${ISTIO_SIDECAR_CONFIG}"
fi
ISTIO_CLUSTER_CONFIG=${ISTIO_CLUSTER_CONFIG:-./var/lib/istio/envoy/cluster.env}
if [[ -r ${ISTIO_CLUSTER_CONFIG} ]]; then
  # shellcheck disable=SC1090
  . "${ISTIO_CLUSTER_CONFIG}"
fi
set +a

ISTIO_BIN_BASE=${ISTIO_BIN_BASE:-/usr/local/bin}
ISTIO_AGENT_HOME=${ISTIO_AGENT_HOME:-/usr/local/lib/istio-agent}
ISTIO_LOG_DIR=${ISTIO_LOG_DIR:-./var/log/istio}
NS=${ISTIO_NAMESPACE:-default}
SVC=${ISTIO_SERVICE:-rawvm}
ISTIO_SYSTEM_NAMESPACE=${ISTIO_SYSTEM_NAMESPACE:-istio-system}
CONTROL_PLANE_AUTH_POLICY=${ISTIO_CP_AUTH:-MUTUAL_TLS}

find_pilot_agent() {
  local candidate
  for candidate in "${ISTIO_BIN_BASE}/pilot-agent" "${ISTIO_AGENT_HOME}/bin/pilot-agent"; do
    if [[ -x ${candidate} ]]; then
      echo "${candidate}"
      return 0
    fi
  done
  if candidate=$(command -v pilot-agent); then
    echo "${candidate}"
    return 0
  fi
  echo "istio-start.sh: no pilot-agent in ${ISTIO_BIN_BASE}, ${ISTIO_AGENT_HOME}/bin or PATH" >&2
  return 1
}
PILOT_AGENT=$(find_pilot_agent)

if [[ -z ${ISTIO_SVC_IP:-} ]]; then
  ISTIO_SVC_IP=$(hostname --all-ip-addresses | cut -d ' ' -f 1)
fi
if [[ -z ${POD_NAME:-} ]]; then
  POD_NAME=$(hostname -s)
fi

if [[ ${1-} == clean ]]; then
  if [[ ${ISTIO_CUSTOM_IP_TABLES:-} != true ]]; then
    "${PILOT_AGENT}" istio-iptables --cleanup-only
  fi
  exit 0
fi

if [[ ${ISTIO_CUSTOM_IP_TABLES:-} != true ]]; then
  if [[ ${1-} == init || ${1-} == -p ]]; then
    # A machine may still hold rules from a previous start (unlike a fresh pod): remove them first.
    "${PILOT_AGENT}" istio-iptables "$@" --cleanup-only
    "${PILOT_AGENT}" istio-iptables "$@"
    exit 0
  fi
  if [[ ${1-} != run ]]; then
    "${PILOT_AGENT}" istio-iptables --cleanup-only
    "${PILOT_AGENT}" istio-iptables
  fi
fi

EXEC_USER=${EXEC_USER:-istio-proxy}
if [[ ${ISTIO_INBOUND_INTERCEPTION_MODE:-} == TPROXY ]]; then
  EXEC_USER=root  # transparent listeners need CAP_NET_ADMIN
fi

DEFAULT_PILOT_ADDRESS="istiod.${ISTIO_SYSTEM_NAMESPACE}.svc:15012"
CUSTOM_PILOT_ADDRESS=${PILOT_ADDRESS:-}
if [[ -z ${CUSTOM_PILOT_ADDRESS} && -n ${ISTIO_PILOT_PORT:-} ]]; then
  CUSTOM_PILOT_ADDRESS="istiod.${ISTIO_SYSTEM_NAMESPACE}.svc:${ISTIO_PILOT_PORT}"
fi
CA_ADDR=${CA_ADDR:-${CUSTOM_PILOT_ADDRESS:-${DEFAULT_PILOT_ADDRESS}}}
PROV_CERT=${PROV_CERT-./etc/certs}
OUTPUT_CERTS=${OUTPUT_CERTS-./etc/certs}
export PROV_CERT OUTPUT_CERTS CA_ADDR

IFS=' ' read -r -a AGENT_FLAGS <<< "${ISTIO_AGENT_FLAGS:-}"

DEFAULT_PROXY_CONFIG="
serviceCluster: ${SVC}
controlPlaneAuthPolicy: ${CONTROL_PLANE_AUTH_POLICY}
"
if [[ -n ${CUSTOM_PILOT_ADDRESS} ]]; then
  PROXY_CONFIG="${PROXY_CONFIG:-}
discoveryAddress: ${CUSTOM_PILOT_ADDRESS}
"
fi
export PROXY_CONFIG=${PROXY_CONFIG:-${DEFAULT_PROXY_CONFIG}}
export INSTANCE_IP=${ISTIO_SVC_IP} POD_NAME POD_NAMESPACE=${NS}

if [[ ${EXEC_USER} == "${USER:-}" ]]; then
  # Already the agent's user (run by hand): start it in the foreground, output where it is.
  exec "${PILOT_AGENT}" proxy "${AGENT_FLAGS[@]}"
fi

if ! getent passwd "${EXEC_USER}" >/dev/null; then
  if [[ ${EXEC_USER} != istio-proxy ]]; then
    echo "istio-start.sh: EXEC_USER ${EXEC_USER}: no such user" >&2
    exit 1
  fi
  # What the package's postinst does, for a machine where the agent was installed by other means.
  getent group istio-proxy >/dev/null || groupadd --system istio-proxy
  useradd --system --gid istio-proxy --home-dir /var/lib/istio --no-create-home istio-proxy
fi
if [[ ! -d ${ISTIO_LOG_DIR} ]]; then
  install -d -o "${EXEC_USER}" -m 0755 "${ISTIO_LOG_DIR}"  # the agent's own output goes there
fi
# setpriv keeps the environment (as upstream's `sudo -E`), sets uid, gid and the user's groups, and execs.
exec setpriv --reuid "${EXEC_USER}" --regid "$(id -g "${EXEC_USER}")" --init-groups -- \
  "${BASH}" -c 'log=$1; shift; exec "$@" 2>>"${log}/istio.err.log" >>"${log}/istio.log"' istio-start \
  "${ISTIO_LOG_DIR}" "${PILOT_AGENT}" proxy "${AGENT_FLAGS[@]}"
