# Sourced by scripts/demo and scripts/test: run inside a Python virtualenv with this package installed.
#
#   use_project_venv ROOT EXTRA MODULE...
#
# Inside an active virtualenv (VIRTUAL_ENV set) that one is used: the package is installed into it with pip
# only when one of MODULE... cannot be imported. Otherwise ROOT/.venv is created when missing (Debian's and
# Ubuntu's system python3 refuse `pip install`, PEP 668), the package is installed into it once, again
# whenever ROOT/pyproject.toml is newer than the marker file left in the venv, and the venv is put first on
# PATH for the rest of the script. EXTRA is "" (the package alone) or an optional-dependency group ("test").
# Without a working `python3 -m venv` it prints one line saying what to install and exits 1.

venv_say() { printf '%s: %s\n' "$(basename "$0")" "$*" >&2; }

venv_install() {
    local python="$1" root="$2" extra="$3"
    local spec="${root}"
    [[ -z "${extra}" ]] || spec="${root}[${extra}]"
    PIP_DISABLE_PIP_VERSION_CHECK=1 "${python}" -m pip install -q -e "${spec}"
}

use_project_venv() {
    local root="$1" extra="$2"
    shift 2
    if [[ -n "${VIRTUAL_ENV:-}" ]]; then
        local module
        for module in "$@"; do
            if ! python3 -c "import ${module}" 2>/dev/null; then
                venv_install python3 "${root}" "${extra}"
                break
            fi
        done
        return 0
    fi
    local venv="${root}/.venv"
    local marker="${venv}/.llama-router-installed${extra:+-${extra}}"
    if [[ ! -x "${venv}/bin/python" ]]; then
        local hint="install it with \`apt-get install python3-venv\` on Debian/Ubuntu (or your system's python3 venv package)"
        if ! python3 -c "import ensurepip, venv" 2>/dev/null; then
            venv_say "python3 cannot create a virtualenv (no venv/ensurepip module): ${hint}"
            exit 1
        fi
        venv_say "creating the virtualenv ${venv}"
        if ! python3 -m venv "${venv}" >/dev/null 2>&1; then
            rm -rf "${venv}"
            venv_say "\`python3 -m venv ${venv}\` failed: ${hint}"
            exit 1
        fi
    fi
    if [[ ! -f "${marker}" || "${root}/pyproject.toml" -nt "${marker}" ]]; then
        venv_say "installing the package into ${venv}"
        venv_install "${venv}/bin/python" "${root}" "${extra}"
        touch "${marker}"
        # The test extras include the package itself: a later `scripts/demo` needs no install of its own.
        [[ -z "${extra}" ]] || touch "${venv}/.llama-router-installed"
    fi
    export VIRTUAL_ENV="${venv}"
    export PATH="${venv}/bin:${PATH}"
    unset PYTHONHOME
}
