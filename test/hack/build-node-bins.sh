#!/usr/bin/env bash
# Builds the real node's binaries for the test framework (test/framework/realnode)
# into OUT_DIR (default: <repo>/bin/node):
#   kubelet                    k8s.io/kubernetes (module nodebins/kubelet, the
#                              version test/go.mod uses for the control plane)
#   containerd, ctr,
#   containerd-shim-runc-v2    github.com/containerd/containerd/v2
#                              (module nodebins/containerd)
# runc, the CNI plugins and busybox come from Debian (make test-node-deps).
#
# Each part is skipped when OUT_DIR holds its binaries and a stamp that names
# the same module version and Go toolchain.
set -euo pipefail

hack_dir="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
out_dir="${1:-${hack_dir}/../../bin/node}"
mkdir -p "${out_dir}"
out_dir="$(cd "${out_dir}" && pwd)"
go_version="$(go env GOVERSION)"

# build NAME MODULE_DIR MODULE TAGS LDFLAGS PKG...
build() {
	local name="$1" dir="$2" module="$3" tags="$4" ldflags="$5"
	shift 5
	local version want stamp="${out_dir}/.${name}.stamp" ok=1
	version="$(cd "${dir}" && go list -m -f '{{.Version}}' "${module}")"
	want="${module} ${version} ${go_version}"
	for p in "$@"; do [[ -x "${out_dir}/$(basename "${p}")" ]] || ok=0; done
	if [[ ${ok} == 1 && -f "${stamp}" && "$(cat "${stamp}")" == "${want}" ]]; then
		echo "node-bins: ${name} up to date (${want}) in ${out_dir}"
		return
	fi
	echo "node-bins: building ${name} (${want}) into ${out_dir}"
	local start
	start=$(date +%s)
	rm -f "${stamp}"
	(cd "${dir}" && go build -tags "${tags}" -ldflags "${ldflags}" -o "${out_dir}/" "$@")
	echo "${want}" >"${stamp}"
	echo "node-bins: ${name} built in $(($(date +%s) - start))s"
}

k8s_version="$(cd "${hack_dir}/nodebins/kubelet" && go list -m -f '{{.Version}}' k8s.io/kubernetes)"
major="${k8s_version#v}"
major="${major%%.*}"
minor="${k8s_version#v*.}"
minor="${minor%%.*}"
pkg=k8s.io/component-base/version
build kubelet "${hack_dir}/nodebins/kubelet" k8s.io/kubernetes "" \
	"-s -w -X ${pkg}.gitVersion=${k8s_version} -X ${pkg}.gitMajor=${major} -X ${pkg}.gitMinor=${minor} -X ${pkg}.gitTreeState=clean" \
	k8s.io/kubernetes/cmd/kubelet

ctrd=github.com/containerd/containerd/v2
ctrd_version="$(cd "${hack_dir}/nodebins/containerd" && go list -m -f '{{.Version}}' "${ctrd}")"
build containerd "${hack_dir}/nodebins/containerd" "${ctrd}" "no_btrfs no_devmapper no_zfs" \
	"-s -w -X ${ctrd}/version.Version=${ctrd_version}" \
	"${ctrd}/cmd/containerd" "${ctrd}/cmd/containerd-shim-runc-v2" "${ctrd}/cmd/ctr"
