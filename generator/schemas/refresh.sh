#!/usr/bin/env bash
# Fetches the upstream schemas in this folder again, verbatim, from the commits pinned below (or
# from the refs given in the environment, e.g. ENVOY_GATEWAY_REF=v1.9.0), and reports which files
# changed. The generator's tests validate every emitted document against these files
# (tests/common/crds.rs, tests/agentgateway.rs); after a refresh, run `cargo test -p llmkube-gen`
# and update the commit column of README.md.
#
#   bash generator/schemas/refresh.sh
set -euo pipefail

DIR="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
cd "$DIR"

ENVOY_GATEWAY_REF="${ENVOY_GATEWAY_REF:-d32f28294245e454d20f81d323d626a90e660c1e}"
AI_GATEWAY_REF="${AI_GATEWAY_REF:-c217da8a539570ba3f6014a60c2687c29a945f1f}"
GATEWAY_API_REF="${GATEWAY_API_REF:-4564255ac2c35d582249b3cdf261bdf51c8bca32}"
INFERENCE_EXTENSION_REF="${INFERENCE_EXTENSION_REF:-84436a96b9e6ce2b59ddacd3d04c31b4fbd442de}"
AGENTGATEWAY_REF="${AGENTGATEWAY_REF:-75b4e6ce6e0e1ac7959d5548ebe8dbeaede4f180}"
AGENTGATEWAY_CONFIG_REF="${AGENTGATEWAY_CONFIG_REF:-v1.3.1}"

# local file | repository | ref | path in the repository
SOURCES="
envoy-gateway/gateway.envoyproxy.io_envoyextensionpolicies.yaml|envoyproxy/gateway|$ENVOY_GATEWAY_REF|charts/gateway-helm/charts/crds/crds/generated/gateway.envoyproxy.io_envoyextensionpolicies.yaml
envoy-gateway/gateway.envoyproxy.io_envoypatchpolicies.yaml|envoyproxy/gateway|$ENVOY_GATEWAY_REF|charts/gateway-helm/charts/crds/crds/generated/gateway.envoyproxy.io_envoypatchpolicies.yaml
envoy-gateway/gateway.envoyproxy.io_clienttrafficpolicies.yaml|envoyproxy/gateway|$ENVOY_GATEWAY_REF|charts/gateway-helm/charts/crds/crds/generated/gateway.envoyproxy.io_clienttrafficpolicies.yaml
envoy-gateway/gateway.envoyproxy.io_backendtrafficpolicies.yaml|envoyproxy/gateway|$ENVOY_GATEWAY_REF|charts/gateway-helm/charts/crds/crds/generated/gateway.envoyproxy.io_backendtrafficpolicies.yaml
envoy-gateway/gateway.envoyproxy.io_securitypolicies.yaml|envoyproxy/gateway|$ENVOY_GATEWAY_REF|charts/gateway-helm/charts/crds/crds/generated/gateway.envoyproxy.io_securitypolicies.yaml
envoy-gateway/gateway.envoyproxy.io_backends.yaml|envoyproxy/gateway|$ENVOY_GATEWAY_REF|charts/gateway-helm/charts/crds/crds/generated/gateway.envoyproxy.io_backends.yaml
ai-gateway/aigateway.envoyproxy.io_aigatewayroutes.yaml|envoyproxy/ai-gateway|$AI_GATEWAY_REF|manifests/charts/ai-gateway-crds-helm/templates/aigateway.envoyproxy.io_aigatewayroutes.yaml
ai-gateway/aigateway.envoyproxy.io_aiservicebackends.yaml|envoyproxy/ai-gateway|$AI_GATEWAY_REF|manifests/charts/ai-gateway-crds-helm/templates/aigateway.envoyproxy.io_aiservicebackends.yaml
ai-gateway/aigateway.envoyproxy.io_backendsecuritypolicies.yaml|envoyproxy/ai-gateway|$AI_GATEWAY_REF|manifests/charts/ai-gateway-crds-helm/templates/aigateway.envoyproxy.io_backendsecuritypolicies.yaml
gateway-api/gateway.networking.k8s.io_gateways.yaml|kubernetes-sigs/gateway-api|$GATEWAY_API_REF|config/crd/standard/gateway.networking.k8s.io_gateways.yaml
gateway-api/gateway.networking.k8s.io_httproutes.yaml|kubernetes-sigs/gateway-api|$GATEWAY_API_REF|config/crd/standard/gateway.networking.k8s.io_httproutes.yaml
gateway-api/gateway.networking.k8s.io_referencegrants.yaml|kubernetes-sigs/gateway-api|$GATEWAY_API_REF|config/crd/standard/gateway.networking.k8s.io_referencegrants.yaml
inference-extension/inference.networking.k8s.io_inferencepools.yaml|kubernetes-sigs/gateway-api-inference-extension|$INFERENCE_EXTENSION_REF|config/crd/bases/inference.networking.k8s.io_inferencepools.yaml
agentgateway/agentgateway.dev_agentgatewaypolicies.yaml|agentgateway/agentgateway|$AGENTGATEWAY_REF|controller/install/helm/agentgateway-crds/templates/agentgateway.dev_agentgatewaypolicies.yaml
agentgateway/agentgateway.dev_agentgatewaybackends.yaml|agentgateway/agentgateway|$AGENTGATEWAY_REF|controller/install/helm/agentgateway-crds/templates/agentgateway.dev_agentgatewaybackends.yaml
agentgateway/config-schema-v1.3.1.json|agentgateway/agentgateway|$AGENTGATEWAY_CONFIG_REF|schema/local.json
"

tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT
# Fetch everything first: a failed download leaves the folder as it was.
failed=0
while IFS='|' read -r file repo ref path; do
    [ -n "$file" ] || continue
    url="https://raw.githubusercontent.com/$repo/$ref/$path"
    mkdir -p "$tmp/$(dirname "$file")"
    if ! curl -fsSL --retry 3 -o "$tmp/$file" "$url"; then
        echo "FAILED  $file <- $url" >&2
        failed=1
    fi
done <<<"$SOURCES"
[ "$failed" -eq 0 ] || { echo "some files could not be fetched; nothing was changed" >&2; exit 1; }

changed=0
while IFS='|' read -r file repo ref _; do
    [ -n "$file" ] || continue
    if cmp -s "$tmp/$file" "$file"; then
        echo "same    $file"
    else
        mkdir -p "$(dirname "$file")"
        cp "$tmp/$file" "$file"
        echo "updated $file <- $repo@$ref"
        changed=1
    fi
done <<<"$SOURCES"
if [ "$changed" -eq 1 ]; then
    echo "files changed: run 'cargo test -p llmkube-gen' and update README.md's table"
fi
