/* How much memory this process may still take. */
#ifndef LMX_SYSMEM_H
#define LMX_SYSMEM_H

#include <stddef.h>

/* The bytes a load may take without swapping or meeting the out-of-memory
 * killer: the kernel's MemAvailable (/proc/meminfo), lowered to what the
 * process's memory cgroup allows (a container's limit: cgroup v2's
 * memory.max or v1's memory.limit_in_bytes, on the process's group and each
 * one above it, less the group's usage but for its inactive file cache,
 * which the kernel reclaims first). SIZE_MAX when neither is known. */
size_t lmx_mem_available(void);

/* The same from the given files and cgroup mount (tests): meminfo as
 * /proc/meminfo, self_cgroup as /proc/self/cgroup, root as /sys/fs/cgroup. */
size_t lmx_mem_available_at(const char *meminfo, const char *self_cgroup, const char *root);

/* The number after `key` on the first line of the file that starts with it
 * ("key N", as in /proc/meminfo, /proc/self/status, cgroup files), times
 * unit; 0 when the file, the key or a number is missing (a limit of "max"
 * too). */
unsigned long long lmx_file_value(const char *path, const char *key, unsigned long long unit);

#endif
