#include "cpu_path.h"

#include <stdlib.h>
#include <string.h>
#if defined(__linux__)
#include <sys/syscall.h>
#include <unistd.h>
#endif

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#define LMX_X86 1
#include <cpuid.h>
#endif

static const char *const names[LMX_CPU_PATH_COUNT] = {"scalar", "avx2", "avx512", "amx"};

const char *lmx_cpu_path_name(lmx_cpu_path p)
{
    return (unsigned)p < LMX_CPU_PATH_COUNT ? names[p] : "?";
}

#ifdef LMX_X86
/* What the AVX2 path needs (the AVX-512 path uses it too); NULL if present. */
static const char *avx2_lack(void)
{
    unsigned a, b, c, d;
    __builtin_cpu_init();
    if (!__builtin_cpu_supports("avx2"))
        return "CPU lacks avx2";
    if (!__builtin_cpu_supports("fma"))
        return "CPU lacks fma";
    /* F16C: CPUID 1, ECX bit 29 (no __builtin_cpu_supports name everywhere) */
    if (!__get_cpuid(1, &a, &b, &c, &d) || !((c >> 29) & 1))
        return "CPU lacks f16c";
    return NULL;
}

static const char *avx512_lack(void)
{
    __builtin_cpu_init();
    if (!__builtin_cpu_supports("avx512f"))
        return "CPU lacks avx512f";
    if (!__builtin_cpu_supports("avx512bw"))
        return "CPU lacks avx512bw";
    if (!__builtin_cpu_supports("avx512vl"))
        return "CPU lacks avx512vl";
    if (!__builtin_cpu_supports("avx512vnni"))
        return "CPU lacks avx512vnni";
    return avx2_lack();
}

/* AVX-512 BF16: CPUID 7.1 EAX bit 5, on top of the AVX-512 path's needs. */
static const char *avx512_bf16_lack(void)
{
    unsigned a, b, c, d;
    const char *lack = avx512_lack();
    if (lack)
        return lack;
    if (!__get_cpuid_count(7, 1, &a, &b, &c, &d) || !((a >> 5) & 1))
        return "CPU lacks avx512bf16";
    return NULL;
}

/* AMX: the instructions (CPUID 7.0 EDX bits 22, 24), AVX-512 BF16, and the
 * kernel's leave to use the tile data state, which Linux grants per
 * process on request. */
static const char *amx_lack(void)
{
    unsigned a, b, c, d;
    const char *lack = avx512_bf16_lack();
    if (lack)
        return lack;
    if (!__get_cpuid_count(7, 0, &a, &b, &c, &d) || !((d >> 22) & 1) || !((d >> 24) & 1))
        return "CPU lacks amx-bf16";
#if defined(__linux__) && defined(SYS_arch_prctl)
    enum { ARCH_REQ_XCOMP_PERM = 0x1023, XFEATURE_XTILEDATA = 18 };
    if (syscall(SYS_arch_prctl, ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA))
        return "the kernel refused AMX tile data (arch_prctl)";
    return NULL;
#else
    return "AMX needs Linux";
#endif
}
#endif

int lmx_cpu_path_supported(lmx_cpu_path p, const char **why)
{
    const char *lack = NULL;
    if (p == LMX_CPU_SCALAR)
        lack = NULL;
#ifdef LMX_X86
    else if (p == LMX_CPU_AVX2)
        lack = avx2_lack();
    else if (p == LMX_CPU_AVX512)
        lack = avx512_lack();
    else if (p == LMX_CPU_AMX)
        lack = amx_lack();
#else
    else if (p == LMX_CPU_AVX2 || p == LMX_CPU_AVX512 || p == LMX_CPU_AMX)
        lack = "not an x86-64 build";
#endif
    else
        lack = "unknown path";
    if (why)
        *why = lack;
    return lack == NULL;
}

int lmx_cpu_avx512_bf16(const char **why)
{
#ifdef LMX_X86
    const char *lack = avx512_bf16_lack();
#else
    const char *lack = "not an x86-64 build";
#endif
    if (why)
        *why = lack;
    return lack == NULL;
}

lmx_status lmx_cpu_path_select(lmx_cpu_path *out, lmx_error *err)
{
    const char *env = getenv("LMX_CPU_PATH");
    if (env && *env) {
        for (int p = 0; p < LMX_CPU_PATH_COUNT; p++)
            if (!strcmp(env, names[p])) {
                const char *why = NULL;
                if (!lmx_cpu_path_supported((lmx_cpu_path)p, &why))
                    return lmx_fail(err, LMX_ERR_UNSUPPORTED, "LMX_CPU_PATH=%s: %s", env, why);
                *out = (lmx_cpu_path)p;
                return LMX_OK;
            }
        return lmx_fail(err, LMX_ERR_ARG, "LMX_CPU_PATH=%s: want amx, avx512, avx2 or scalar", env);
    }
    for (int p = LMX_CPU_PATH_COUNT - 1; p > 0; p--)
        if (lmx_cpu_path_supported((lmx_cpu_path)p, NULL)) {
            *out = (lmx_cpu_path)p;
            return LMX_OK;
        }
    *out = LMX_CPU_SCALAR;
    return LMX_OK;
}
