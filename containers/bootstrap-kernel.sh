#!/bin/sh
# trikernel's container entry point under gateway_provisioners' (and Enterprise
# Gateway's) Kubernetes, Docker and Docker Swarm provisioners; see docs/gateway.md.
#
# The provisioner starts the image with the launcher's parameters in the
# environment (GP kernel-launchers/kubernetes/scripts/launch_kubernetes.py and
# kernel-launchers/docker/scripts/launch_docker.py; Enterprise Gateway's
# bootstrap reads the EG_* names as fall-backs, so does this script):
#
#   KERNEL_ID            required
#   RESPONSE_ADDRESS     required, IP:PORT of the server's response socket
#   PUBLIC_KEY           required, the server's RSA public key (base64 DER)
#   PORT_RANGE           optional, L..U, default 0..0 (any port)
#   TRANSPORT_ENCRYPTION optional, auto | required | empty (no CurveZMQ)
#   KERNEL_SPARK_CONTEXT_INIT_MODE  passed on when not "none" (trikernel warns: no Spark)
#   TRIKERNEL_PYTHON     interpreter to run (default: python)
#
# Extra arguments are appended to the gateway-launch command line.
#
# JPY_PARENT_PID is unset: the provisioners copy the server's environment
# into the container, so it names a process of another machine (the kernel
# ignores it unless it happens to equal its parent's pid here). In a
# container the provisioner owns the lifecycle: it deletes the pod or
# container.
set -eu

missing=""
[ -n "${KERNEL_ID:-}" ] || missing="$missing KERNEL_ID"
RESPONSE_ADDRESS="${RESPONSE_ADDRESS:-${EG_RESPONSE_ADDRESS:-}}"
[ -n "$RESPONSE_ADDRESS" ] || missing="$missing RESPONSE_ADDRESS"
PUBLIC_KEY="${PUBLIC_KEY:-${EG_PUBLIC_KEY:-}}"
[ -n "$PUBLIC_KEY" ] || missing="$missing PUBLIC_KEY"
if [ -n "$missing" ]; then
    echo "bootstrap-kernel.sh: missing environment variable(s):$missing (set by the gateway provisioner)" >&2
    exit 2
fi
PORT_RANGE="${PORT_RANGE:-${EG_PORT_RANGE:-0..0}}"

set -- --kernel-id "$KERNEL_ID" --response-address "$RESPONSE_ADDRESS" --public-key "$PUBLIC_KEY" \
    --port-range "$PORT_RANGE" "$@"
if [ -n "${TRANSPORT_ENCRYPTION:-}" ]; then
    set -- --transport-encryption "$TRANSPORT_ENCRYPTION" "$@"
fi
if [ -n "${KERNEL_SPARK_CONTEXT_INIT_MODE:-}" ] && [ "$KERNEL_SPARK_CONTEXT_INIT_MODE" != "none" ]; then
    set -- --spark-context-initialization-mode "$KERNEL_SPARK_CONTEXT_INIT_MODE" "$@"
fi

unset JPY_PARENT_PID
exec "${TRIKERNEL_PYTHON:-python}" -m trikernel gateway-launch "$@"
