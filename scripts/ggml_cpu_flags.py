"""CMake options for building llama.cpp (llama-cpp-python) for this machine's CPU, AMX left out.

A native build (-march=native) turns on ggml's AMX kernels where the CPU has AMX, and those
crashed in `ggml_backend_amx_mul_mat` on the first decode on our AMX machines (Q4_K_M and Q4_1
models alike). So the instruction sets are named one by one from /proc/cpuinfo instead.
"""
from __future__ import annotations

# ggml option -> the /proc/cpuinfo flags it needs
OPTIONS = {
    "GGML_SSE42": ["sse4_2"],
    "GGML_AVX": ["avx"],
    "GGML_AVX2": ["avx2"],
    "GGML_FMA": ["fma"],
    "GGML_F16C": ["f16c"],
    "GGML_BMI2": ["bmi2"],
    "GGML_AVX_VNNI": ["avx_vnni"],
    "GGML_AVX512": ["avx512f", "avx512cd", "avx512vl", "avx512dq", "avx512bw"],
    "GGML_AVX512_VBMI": ["avx512vbmi"],
    "GGML_AVX512_VNNI": ["avx512_vnni"],
    "GGML_AVX512_BF16": ["avx512_bf16"],
}


def cpu_flags() -> set[str]:
    try:
        text = open("/proc/cpuinfo").read()
    except OSError:
        return set()
    return {f for line in text.splitlines() if line.startswith("flags") for f in line.split(":", 1)[1].split()}


def main() -> None:
    flags = cpu_flags()
    if not flags:  # not Linux/x86: let llama.cpp choose
        print("-DGGML_NATIVE=ON")
        return
    args = ["-DGGML_NATIVE=OFF", "-DGGML_AMX_TILE=OFF", "-DGGML_AMX_INT8=OFF", "-DGGML_AMX_BF16=OFF"]
    args += [f"-D{opt}={'ON' if all(f in flags for f in need) else 'OFF'}" for opt, need in OPTIONS.items()]
    print(" ".join(args))


if __name__ == "__main__":
    main()
