#!/usr/bin/env bash
# Makes a checkout's venv: the locked dependencies (constraints.txt), then this checkout's package,
# editable, with the extras the tests and the bench need. `make` runs it: bash make/venv.sh PYTHON VENV CACHE EXTRAS
#
# The dependencies are installed once per lock and Python, into a venv kept in this user's cache
# (CACHE/venv/<hash of the two>) and compiled there; a checkout's venv is a copy of it made of hard
# links (a plain copy where the cache is on another file system), with the paths in its scripts
# rewritten, to which pip then adds the package alone: a fresh clone installs and compiles nothing
# but this package (README "Set-up on a fresh machine" has the times).
# Hard links share contents: a dependency's file edited in place in one checkout's venv is edited in
# every other's and in the cache's (pip replaces files, it never edits them); removing CACHE/venv
# undoes it, the next run making the cached venv again.
#
# The cached venv is made from wheels, kept in CACHE/wheels/<hash of constraints.txt> (pip reads a
# package index one project at a time; a wheel folder is read at once), so no install reads an index
# but the first: a dependency that pyproject.toml gains and constraints.txt lacks fails the install.
# When one is made, the wheels of other locks and the venvs of other locks or Pythons are removed
# (a venv is 1.3 GB); one checkout makes them at a time.
set -euo pipefail
python=$1 venv=$2 cache=$3 extras=$4

lock_key=$(sha256sum constraints.txt | cut -c1-16)
key=$({ "$python" -c 'import sys; print(sys.executable, sys.version)'; cat constraints.txt; } | sha256sum | cut -c1-16)
wheels=$cache/wheels/$lock_key
base=$cache/venv/$key

# Only the other folders of $1, keeping $2.
remove_others() { find "$1" -mindepth 1 -maxdepth 1 ! -name "$2" -exec rm -rf {} +; }

mkdir -p "$cache"
exec 9>"$cache/.lock"
flock 9

if [ ! -e "$base/.complete" ]; then
	rm -rf "$base"
	"$python" -m venv "$base"
	"$base/bin/python" -m pip install --quiet --upgrade pip "setuptools>=77" wheel
	if [ ! -d "$wheels" ]; then
		rm -rf "$wheels.new"
		"$base/bin/python" -m pip wheel --quiet --no-deps -r constraints.txt "setuptools>=77" wheel -w "$wheels.new" ||
			{ rm -rf "$wheels.new"; exit 1; }
		mv -T "$wheels.new" "$wheels"
		remove_others "$cache/wheels" "$lock_key"
	fi
	"$base/bin/python" -m pip install --quiet --no-compile --no-index --find-links "$wheels" -r constraints.txt
	# pip compiles what it installs one file at a time; compileall does it on every CPU, but not what
	# nothing imports here: the dependencies' own test suites (a quarter of the files, pandas' mostly),
	# pip, setuptools and mypy (mypy and mypyc run compiled). A dependency's file that is not Python 3
	# (test data, a template) would fail to compile, as under pip: not an error.
	"$base/bin/python" -m compileall -q -j 0 -x '/(tests?|pip|setuptools|mypyc?)/' \
		"$("$base/bin/python" -c "import sysconfig; print(sysconfig.get_paths()['purelib'])")" >/dev/null || true
	touch "$base/.complete"
	remove_others "$cache/venv" "$key"
fi

if [ "$(cat "$venv/.base" 2>/dev/null)" != "$key" ]; then
	rm -rf "$venv"
	cp -al "$base" "$venv" 2>/dev/null || { rm -rf "$venv" && cp -a "$base" "$venv"; }
	rm "$venv/.complete"
	here=$(cd "$venv" && pwd)
	{ grep -rlIZ -- "$base" "$venv/bin" "$venv/pyvenv.cfg" || true; } | xargs -0 -r sed -i "s|$base|$here|g"
	echo "$key" >"$venv/.base"
fi
exec 9>&-

"$venv/bin/python" -m pip install --quiet --no-index --find-links "$wheels" -c constraints.txt --no-build-isolation -e "$extras" || {
	echo "if pip found no distribution of a package, pyproject.toml needs one that constraints.txt lacks: make lock" >&2
	exit 1
}

# setuptools' editable finder (the .pth file pip wrote) imports pathlib, importlib.util, fnmatch and re
# in every Python process of the venv before it runs anything: 52 ms of CPU for `python -c pass`, 25 ms
# without it. The suite starts hundreds of Python processes (subprocesses, the CLI, Spark's Python
# workers), so the .pth file is rewritten to a finder of the same behaviour that imports nothing: the
# name `filechannel`, and only it, is looked up in this checkout's folder, after the venv's own path.
for pth in "$venv"/lib/python*/site-packages/__editable__.filechannel-*.pth; do
	[ -e "$pth" ] || continue # no such file (another setuptools): its finder stays, and a test says so
	"$venv/bin/python" - "$(pwd)" "$pth" <<'PTH'
import os, sys
finder = ("import sys; from importlib.machinery import PathFinder; sys.meta_path.append(type('CheckoutFinder', (), "
          "{'find_spec': staticmethod(lambda name, path=None, target=None, find=PathFinder.find_spec: "
          f"find(name, [{sys.argv[1]!r}]) if name == 'filechannel' else None)}}))")
with open(sys.argv[2] + ".tmp", "w") as f:  # replaced, not edited: a hard-linked file stays as it was (see above)
    f.write(finder + "\n")
os.replace(sys.argv[2] + ".tmp", sys.argv[2])
PTH
done
