# Shared by scripts/tidy, scripts/release, .ci/release-check and .ci/api-check:
# the repository's modules are found by their go.mod files, never listed by hand.
# Source it from the repository's root.

# The path every module of ours starts with.
relay_prefix=github.com/xadm/relay

# relay_modules prints the directory of every module, "." (the core) first.
relay_modules() {
	find . -name go.mod -not -path './.git/*' -not -path '*/testdata/*' -printf '%h\n' |
		sed 's|^\./||' | LC_ALL=C sort | awk '$0 == "." { print; next } { rest = rest $0 "\n" } END { printf "%s", rest }'
}

# relay_published prints the modules an adopter can use (and that a release
# tags): every module but those under an internal directory.
relay_published() {
	relay_modules | grep -Ev '(^|/)internal(/|$)' || true
}

# relay_module_path DIR prints the module path declared in DIR/go.mod.
relay_module_path() {
	awk '$1 == "module" { print $2; exit }' "$1/go.mod"
}

# relay_tag DIR VERSION prints the tag Go expects for the module in DIR.
relay_tag() {
	if [ "$1" = . ]; then echo "$2"; else echo "$1/$2"; fi
}

# relay_required_version prints the one version the modules require of ours
# (the development version), or fails if they disagree.
relay_required_version() {
	local versions
	versions=$(relay_modules | while read -r d; do
		grep -hoE "^\s*(require\s+)?$relay_prefix(/[^ ]*)? v[^ ]+" "$d/go.mod" | awk '{ print $NF }'
	done | LC_ALL=C sort -u)
	if [ -z "$versions" ]; then
		echo "no module requires another of ours" >&2
		return 1
	fi
	if [ "$(echo "$versions" | wc -l)" -ne 1 ]; then
		echo "the modules require different versions of ours: $(echo $versions)" >&2
		return 1
	fi
	echo "$versions"
}

# relay_set_requires VERSION makes every module require VERSION of each of ours
# it requires.
relay_set_requires() {
	local d p
	relay_modules | while read -r d; do
		for p in $(grep -hoE "^\s*(require\s+)?$relay_prefix(/[^ ]*)? v[^ ]+" "$d/go.mod" | awk '{ print $(NF-1) }'); do
			(cd "$d" && go mod edit -require="$p@$1")
		done
	done
}

# relay_write_gowork VERSION rewrites go.work: every module in use, and each
# published module's VERSION replaced by its directory. A module in a
# workspace does not replace the versions other modules require of it (Go's
# graph still reads their go.mod), so without the replaces an unpublished
# version would be fetched from the proxy. go.work leaks into no adopter.
relay_write_gowork() {
	local d gov=1.25.0 v
	for d in $(relay_modules); do
		v=$(awk '$1 == "go" { print $2; exit }' "$d/go.mod")
		if [ "$(printf '%s\n%s\n' "$gov" "$v" | sort -V | tail -1)" = "$v" ]; then gov=$v; fi
	done
	{
		echo "// The workspace of relay's modules, for development: builds and tests in any"
		echo "// module directory use the others' work trees. Written by scripts/release;"
		echo "// adopters never see it. Do not run 'go work sync' (it would raise each"
		echo "// module's requirements to the workspace's)."
		echo
		echo "go $gov"
		echo
		echo "use ("
		relay_modules | sed 's|^\.$|.|; t; s|^|./|' | sed 's|^|\t|'
		echo ")"
		echo
		echo "replace ("
		relay_published | while read -r d; do
			if [ "$d" = . ]; then t=./; else t=./$d; fi
			printf '\t%s %s => %s\n' "$(relay_module_path "$d")" "$1" "$t"
		done
		echo ")"
	} >go.work
	go work edit -fmt
}

# relay_build_proxy VERSION OUT writes a file:// module proxy of every published
# module at VERSION into OUT, from the work tree (the files git tracks), with
# the tool in internal/tools/modproxy.
relay_build_proxy() {
	local root
	root=$(pwd)
	(cd internal/tools/modproxy && go run . -repo "$root" -version "$1" -out "$2")
}
