#!/bin/sh
# The steps Dockerfile.cpu and Dockerfile.gpu share, so that the two images cannot drift: each Dockerfile
# only orders these steps and says where torch and onnxruntime come from. Usage: install.sh STEP [ARGS...]
#
#   system                   Python 3 with venv (apt, if the base lacks it), the `hare` user, /bundle, /cache
#   requirements NAME [ARGS] requirements/NAME.txt from pyproject.toml's pins; ARGS go to requirements.py
#                            (--extra optimize, --skip torch, --replace onnxruntime=..., --add ...)
#   deps NAME                the venv (/opt/hare/venv) with requirements/NAME.txt installed
#   torch                    torch from $TORCH_SPEC (a requirement, or a wheel from build/wheels/, mounted at
#                            /wheels), with $TORCH_INDEX_URL as an extra index when set
#   app SRC                  hare itself from SRC, without dependencies (they are in the venv already)
#   bundle OUT [ARGS]        `hare optimize --out OUT ARGS` from the sources in /src (the default bundle)
#   slim                     fail if torch or transformers made it into the serving venv
#   libs                     make pip-installed NVIDIA libraries (TensorRT, CUDA) visible to the loader
#
# POSIX sh: the base may be Debian's python image, the local stand-in, or an Ubuntu CUDA image.
set -eu

HARE_HOME=/opt/hare
VENV=$HARE_HOME/venv
HARE_UID=10001

pip_install() {
    # The cache is a BuildKit cache mount: kept between builds, never in a layer.
    "$VENV/bin/python" -m pip install --disable-pip-version-check --cache-dir /root/.cache/pip "$@"
}

step_system() {
    if ! python3 -c 'import ensurepip, venv' 2>/dev/null; then
        # Ubuntu CUDA images ship without Python; Debian's slim python images already have it.
        apt-get update -qq
        DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
            python3 python3-venv ca-certificates >/dev/null
        rm -rf /var/lib/apt/lists/*
    fi
    if ! getent passwd hare >/dev/null; then
        if command -v useradd >/dev/null; then
            groupadd --system --gid "$HARE_UID" hare
            useradd --system --uid "$HARE_UID" --gid hare --home-dir /home/hare --create-home \
                --shell /usr/sbin/nologin hare
        else
            # Minimal bases may lack the shadow tools; the two lines they would write suffice.
            echo "hare:x:$HARE_UID:" >>/etc/group
            echo "hare:x:$HARE_UID:$HARE_UID:hare:/home/hare:/usr/sbin/nologin" >>/etc/passwd
            mkdir -p /home/hare
            chown "$HARE_UID:$HARE_UID" /home/hare
        fi
    fi
    # /bundle: the bundle served (the image's default, or a mount); /cache: bundles the optimizer builds at
    # start and TensorRT engines, meant to be a volume.
    mkdir -p "$HARE_HOME" /bundle /cache
    chown hare:hare /cache
}

step_requirements() {
    name=${1:?requirements NAME}
    shift
    mkdir -p "$HARE_HOME/requirements"
    python3 "$HARE_HOME/requirements.py" "$HARE_HOME/pyproject.toml" "$@" >"$HARE_HOME/requirements/$name.txt"
    echo "$name:" && sed 's/^/  /' "$HARE_HOME/requirements/$name.txt"
}

step_deps() {
    [ -x "$VENV/bin/python" ] || python3 -m venv "$VENV"
    pip_install -r "$HARE_HOME/requirements/${1:?deps NAME}.txt"
    prune_openvino
}

prune_openvino() {
    # OpenVINO (the bf16 variant's runtime, when installed) ships GPU and NPU plugins and frontends for
    # TensorFlow, TFLite, PaddlePaddle, PyTorch, JAX and GGUF: hare compiles ONNX for the CPU plugin only, so
    # 63 of its 180 MB go, in the layer that installed them (a later layer's delete would not shrink the image).
    libs=$("$VENV/bin/python" -c "import importlib.util as u, pathlib; s = u.find_spec('openvino'); print(pathlib.Path(s.origin).parent / 'libs' if s else '')")
    [ -n "$libs" ] || return 0
    for unused in intel_gpu_plugin intel_npu_plugin tensorflow_frontend tensorflow_lite_frontend paddle_frontend \
        pytorch_frontend jax_frontend gguf_frontend; do
        rm -f "$libs"/libopenvino_"$unused".so*
    done
}

step_torch() {
    spec=${TORCH_SPEC:-torch==2.13.0}
    # A wheel from the build context's build/wheels/ (mounted at /wheels), named by path or by file name.
    if [ -f "/wheels/$(basename "$spec")" ]; then spec="/wheels/$(basename "$spec")"; fi
    set -- --find-links /wheels
    if [ -n "${TORCH_INDEX_URL:-}" ]; then set -- "$@" --extra-index-url "$TORCH_INDEX_URL"; fi
    pip_install "$@" "$spec"
    "$VENV/bin/python" -c 'import torch; print("torch", torch.__version__, "cuda:", torch.version.cuda)'
}

step_app() {
    pip_install --no-deps "$1"
    "$VENV/bin/hare" --help >/dev/null
}

step_bundle() {
    out=${1:?bundle OUT}
    shift
    # From the sources rather than an installed hare, so that this layer depends on the optimizer's code only.
    cd /src && PYTHONPATH=/src "$VENV/bin/python" -m hare.cli optimize --out "$out" "$@"
}

step_slim() {
    for heavy in torch transformers; do
        if "$VENV/bin/python" -c "import importlib.util, sys; sys.exit(importlib.util.find_spec('$heavy') is None)"; then
            echo "install.sh: $heavy is in the serving image; it must stay out (pyproject's base dependencies)" >&2
            exit 1
        fi
    done
}

step_libs() {
    # Folders of pip-installed NVIDIA libraries (tensorrt_libs, nvidia/*/lib), asked of Python, not guessed.
    "$VENV/bin/python" - >/etc/ld.so.conf.d/hare-nvidia.conf <<'EOF'
import importlib.util, pathlib
roots = []
for name in ("tensorrt_libs", "nvidia"):
    spec = importlib.util.find_spec(name)
    roots += [pathlib.Path(p) for p in (spec.submodule_search_locations or [])] if spec else []
dirs = {str(p.parent) for root in roots for p in root.rglob("lib*.so*")}
print("\n".join(sorted(dirs)))
EOF
    ldconfig
    sed 's/^/library folder: /' /etc/ld.so.conf.d/hare-nvidia.conf
}

cmd=${1:?usage: install.sh system|requirements|deps|torch|app|bundle|slim|libs [ARGS...]}
shift
"step_$cmd" "$@"
