#!/usr/bin/env bash
# Builds kube-apiserver and kube-scheduler from the k8s.io/kubernetes version
# pinned in test/go.mod, and kube-controller-manager from the same version
# in its own module (hack/k8sbins/controller-manager: its kubelet imports
# need other dependency versions than the test module's), into OUT_DIR
# (default: <repo>/bin/k8s).
#
# The build is skipped when OUT_DIR already holds the three binaries and a
# stamp file that names the same Kubernetes version and Go toolchain.
set -euo pipefail

test_dir="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
out_dir="${1:-${test_dir}/../bin/k8s}"
mkdir -p "${out_dir}"
out_dir="$(cd "${out_dir}" && pwd)"

cd "${test_dir}"
k8s_version="$(go list -m -f '{{.Version}}' k8s.io/kubernetes)"
go_version="$(go env GOVERSION)"
want_stamp="k8s.io/kubernetes ${k8s_version} ${go_version}"
stamp="${out_dir}/.stamp"

kcm_dir="${test_dir}/hack/k8sbins/controller-manager"
kcm_version="$(cd "${kcm_dir}" && go list -m -f '{{.Version}}' k8s.io/kubernetes)"
if [[ "${kcm_version}" != "${k8s_version}" ]]; then
	echo "k8s-bins: ${kcm_dir}/go.mod pins k8s.io/kubernetes ${kcm_version}, test/go.mod ${k8s_version}: make them the same" >&2
	exit 1
fi

if [[ -x "${out_dir}/kube-apiserver" && -x "${out_dir}/kube-scheduler" && -x "${out_dir}/kube-controller-manager" && -f "${stamp}" ]] &&
	[[ "$(cat "${stamp}")" == "${want_stamp}" ]]; then
	echo "k8s-bins: up to date (${want_stamp}) in ${out_dir}"
	exit 0
fi

major="${k8s_version#v}"
major="${major%%.*}"
minor="${k8s_version#v*.}"
minor="${minor%%.*}"
pkg=k8s.io/component-base/version
ldflags="-s -w -X ${pkg}.gitVersion=${k8s_version} -X ${pkg}.gitMajor=${major} -X ${pkg}.gitMinor=${minor} -X ${pkg}.gitTreeState=clean"

echo "k8s-bins: building kube-apiserver, kube-scheduler and kube-controller-manager ${k8s_version} with ${go_version} into ${out_dir}"
start=$(date +%s)
rm -f "${stamp}"
go build -ldflags "${ldflags}" -o "${out_dir}/" \
	k8s.io/kubernetes/cmd/kube-apiserver \
	k8s.io/kubernetes/cmd/kube-scheduler
(cd "${kcm_dir}" && go build -ldflags "${ldflags}" -o "${out_dir}/" k8s.io/kubernetes/cmd/kube-controller-manager)
echo "${want_stamp}" >"${stamp}"
echo "k8s-bins: built in $(($(date +%s) - start))s"
