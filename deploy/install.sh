#!/usr/bin/env bash
# Installs Spillway on this host, or under a staging root: the binaries, the systemd units
# (with these paths filled in), the example configuration, shell completions and man pages
# (lbd(8), lbctl(8) and their subcommands', spillway.toml(5)). `./x install` builds the
# release binaries and runs this; run it directly with --bin-dir to install binaries built
# elsewhere. Nothing is started: see the README, "Running it on a
# real host". `lbd --cleanup` removes what lbd put in the kernel; the files are the ones
# listed at the end.
#
#   deploy/install.sh --bin-dir DIR [--prefix /usr/local] [--sysconfdir PREFIX/etc]
#                     [--unitdir PREFIX/lib/systemd/system] [--destdir STAGING]
#
# --destdir (or $DESTDIR) stages the files under STAGING while they name their final
# places (for packaging); --prefix alone installs everything into PREFIX, e.g. a test's
# directory: the configuration in PREFIX/etc/spillway, and the unit pointing there. Only
# the system prefixes (none given, /usr/local, /usr) keep it in /etc/spillway.
set -euo pipefail
src=$(cd "$(dirname "$0")/.." && pwd)

prefix=/usr/local sysconfdir= unitdir= bindir_src= destdir=${DESTDIR:-}
while (($#)); do
    case "$1" in
        --prefix) prefix=$2; shift 2 ;;
        --sysconfdir) sysconfdir=$2; shift 2 ;;
        --unitdir) unitdir=$2; shift 2 ;;
        --destdir) destdir=$2; shift 2 ;;
        --bin-dir) bindir_src=$2; shift 2 ;;
        *) sed -n '2,17p' "$0" | sed 's/^# \{0,1\}//' >&2; exit 2 ;;
    esac
done
[[ -n $bindir_src && -x $bindir_src/lbd && -x $bindir_src/lbctl ]] || { echo "install: --bin-dir must hold lbd and lbctl" >&2; exit 2; }
case $prefix in
    /usr/local | /usr) sysconfdir=${sysconfdir:-/etc} ;;
    *) sysconfdir=${sysconfdir:-$prefix/etc} ;;
esac
unitdir=${unitdir:-$prefix/lib/systemd/system}
bindir=$prefix/bin docdir=$prefix/share/doc/spillway
installed=()

put() { # MODE SOURCE DEST: copies SOURCE to DESTDIR+DEST
    install -D -m "$1" "$2" "$destdir$3"
    installed+=("$3")
}

put 0755 "$bindir_src/lbd" "$bindir/lbd"
put 0755 "$bindir_src/lbctl" "$bindir/lbctl"

tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
for unit in spillway.service spillway-agent.service; do
    sed -e "s|@BINDIR@|$bindir|g" -e "s|@SYSCONFDIR@|$sysconfdir|g" "$src/deploy/systemd/$unit" > "$tmp/$unit"
    put 0644 "$tmp/$unit" "$unitdir/$unit"
done

put 0644 "$src/deploy/spillway.toml" "$docdir/spillway.toml"
put 0644 "$src/deploy/agent.toml" "$docdir/agent.toml"
# A drop-in for agents with --all-netns (see spillway-agent.service).
put 0644 "$src/deploy/systemd/spillway-agent-all-netns.conf" "$docdir/spillway-agent-all-netns.conf"
# An operator's configuration is never replaced. A new spillway.toml gets a random fleet
# seed (root's alone: it is a secret) for the operator to copy to every balancer. Both
# files name their paths (the report key's) where this install keeps the configuration.
seed=$(printf '0x%08x' "$(od -An -N4 -tu4 /dev/urandom | tr -d ' ')")
in_sysconfdir="s|/etc/spillway/|$sysconfdir/spillway/|g"
sed -e "s|^# flow_hash_seed = .*|flow_hash_seed = \"$seed\"   # random, from ./x install: copy it to every balancer, keep it secret|" \
    -e "$in_sysconfdir" "$src/deploy/spillway.toml" > "$tmp/spillway.toml"
sed -e "$in_sysconfdir" "$src/deploy/agent.toml" > "$tmp/agent.toml"
for file in spillway.toml agent.toml; do
    if [[ -e $destdir$sysconfdir/spillway/$file ]]; then
        echo "kept $sysconfdir/spillway/$file (the example is in $docdir)"
    else
        put 0600 "$tmp/$file" "$sysconfdir/spillway/$file"
    fi
done

for bin in lbd lbctl; do
    "$bindir_src/$bin" completions bash > "$tmp/$bin.bash"
    "$bindir_src/$bin" completions zsh > "$tmp/_$bin"
    "$bindir_src/$bin" completions fish > "$tmp/$bin.fish"
    put 0644 "$tmp/$bin.bash" "$prefix/share/bash-completion/completions/$bin"
    put 0644 "$tmp/_$bin" "$prefix/share/zsh/site-functions/_$bin"
    put 0644 "$tmp/$bin.fish" "$prefix/share/fish/vendor_completions.d/$bin.fish"
    mkdir -p "$tmp/man"
    "$bindir_src/$bin" man --dir "$tmp/man"
done
# lbd man also writes spillway.toml.5, the configuration file's page.
for page in "$tmp"/man/*.[58]; do
    put 0644 "$page" "$prefix/share/man/man${page##*.}/$(basename "$page")"
done

printf 'installed %s\n' "${installed[@]}"
cat <<NEXT

Next: edit $sysconfdir/spillway/spillway.toml (iface, then your VIPs), check it with
  lbd check -f $sysconfdir/spillway/spillway.toml
(lbctl diff -f shows what it changes in a running lbd), then
  systemctl daemon-reload && systemctl enable --now spillway          # balancer
  systemctl daemon-reload && systemctl enable --now spillway-agent    # backends
NEXT
