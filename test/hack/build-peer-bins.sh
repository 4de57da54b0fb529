#!/usr/bin/env bash
# Builds the peers of `make bench-peers` (test/bench, docs/bench.md) into
# OUT_DIR (default: <repo>/bin/peers):
#   scheduler-plugins-scheduler  sigs.k8s.io/scheduler-plugins' kube-scheduler
#                                (module peers/scheduler-plugins), and its
#                                CRDs (PodGroup, ElasticQuota) as
#                                scheduler-plugins-crds/*.yaml
#   hami-scheduler               HAMi's scheduler extender, cmd/scheduler of
#                                github.com/Project-HAMi/HAMi (module
#                                peers/hami)
#
# HAMi's module cannot come from the module proxy (its go.mod says
# github.com/Project-HAMi/HAMi while its tags are v2.x, so no tag is a module
# version, and the proxy serves no pseudo-version of it here): the script
# exports the pinned commit from a git copy of HAMi named by HAMI_GIT (a
# clone or a bare repository) into OUT_DIR/src/hami, the directory the
# wrapper module's replace names. Without HAMI_GIT (and without that
# directory) the HAMi part is skipped with a message; scheduler-plugins is
# built either way. PEERS=scheduler-plugins or PEERS=hami builds only one.
#
# Each part is skipped when OUT_DIR holds its binary and a stamp that names
# the same version and Go toolchain.
set -euo pipefail

hack_dir="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
out_dir="${1:-${hack_dir}/../../bin/peers}"
mkdir -p "${out_dir}"
out_dir="$(cd "${out_dir}" && pwd)"
go_version="$(go env GOVERSION)"
peers="${PEERS:-scheduler-plugins hami}"

# HAMi v2.10.0; keep in step with peers/hami/go.mod.
hami_commit=4707fb02c91c545bc7343ce26dba4c32919f9a3e
hami_tag=v2.10.0

# build NAME MODULE_DIR VERSION LDFLAGS PKG: go build PKG in MODULE_DIR into
# OUT_DIR/NAME unless the stamp says it is there already.
build() {
	local name="$1" dir="$2" version="$3" ldflags="$4" pkg="$5"
	local want="${pkg} ${version} ${go_version}" stamp="${out_dir}/.${name}.stamp"
	if [[ -x "${out_dir}/${name}" && -f "${stamp}" && "$(cat "${stamp}")" == "${want}" ]]; then
		echo "peer-bins: ${name} up to date (${want}) in ${out_dir}"
		return
	fi
	echo "peer-bins: building ${name} (${want}) into ${out_dir}"
	local start
	start=$(date +%s)
	rm -f "${stamp}"
	(cd "${dir}" && go build -ldflags "${ldflags}" -o "${out_dir}/${name}" "${pkg}")
	echo "${want}" >"${stamp}"
	echo "peer-bins: ${name} built in $(($(date +%s) - start))s"
}

if [[ " ${peers} " == *" scheduler-plugins "* ]]; then
	sp_dir="${hack_dir}/peers/scheduler-plugins"
	sp_version="$(cd "${sp_dir}" && go list -m -f '{{.Version}}' sigs.k8s.io/scheduler-plugins)"
	k8s_version="$(cd "${sp_dir}" && go list -m -f '{{if .Replace}}{{.Replace.Version}}{{else}}{{.Version}}{{end}}' k8s.io/kubernetes)"
	build scheduler-plugins-scheduler "${sp_dir}" "${sp_version}+k8s-${k8s_version}" \
		"-s -w -X k8s.io/component-base/version.gitVersion=${k8s_version} -X k8s.io/component-base/version.gitTreeState=clean" \
		sigs.k8s.io/scheduler-plugins/cmd/scheduler
	sp_src="$(cd "${sp_dir}" && go list -m -f '{{.Dir}}' sigs.k8s.io/scheduler-plugins)"
	mkdir -p "${out_dir}/scheduler-plugins-crds"
	cp "${sp_src}/manifests/coscheduling/crd.yaml" "${out_dir}/scheduler-plugins-crds/podgroups.yaml"
	cp "${sp_src}/manifests/capacityscheduling/crd.yaml" "${out_dir}/scheduler-plugins-crds/elasticquotas.yaml"
	chmod u+w "${out_dir}/scheduler-plugins-crds/"*.yaml
fi

hami_want="github.com/Project-HAMi/HAMi/cmd/scheduler ${hami_tag}-${hami_commit:0:12} ${go_version}"
if [[ " ${peers} " == *" hami "* && -x "${out_dir}/hami-scheduler" && "$(cat "${out_dir}/.hami-scheduler.stamp" 2>/dev/null)" == "${hami_want}" ]]; then
	echo "peer-bins: hami-scheduler up to date (${hami_want}) in ${out_dir}"
elif [[ " ${peers} " == *" hami "* ]]; then
	src="${out_dir}/src/hami"
	have="$(cat "${src}/.commit" 2>/dev/null || true)"
	if [[ "${have}" != "${hami_commit}" ]]; then
		if [[ -z "${HAMI_GIT:-}" ]]; then
			echo "peer-bins: skipping HAMi: set HAMI_GIT to a git copy of github.com/Project-HAMi/HAMi that has ${hami_tag} (${hami_commit}); its module is not on the module proxy" >&2
			exit 0
		fi
		echo "peer-bins: exporting HAMi ${hami_tag} (${hami_commit}) from ${HAMI_GIT} into ${src}"
		rm -rf "${src}"
		mkdir -p "${src}"
		git -C "${HAMI_GIT}" archive "${hami_commit}" | tar -x -C "${src}"
		echo "${hami_commit}" >"${src}/.commit"
	fi
	# The wrapper's replace points at ../../../../bin/peers/src/hami: build
	# there only when OUT_DIR is the default.
	if [[ "${src}" != "$(cd "${hack_dir}/../.." && pwd)/bin/peers/src/hami" ]]; then
		echo "peer-bins: HAMi builds only into <repo>/bin/peers (its wrapper module's replace names that directory)" >&2
		exit 1
	fi
	build hami-scheduler "${hack_dir}/peers/hami" "${hami_tag}-${hami_commit:0:12}" \
		"-s -w -X github.com/Project-HAMi/HAMi/pkg/version.version=${hami_tag}" \
		github.com/Project-HAMi/HAMi/cmd/scheduler
fi
