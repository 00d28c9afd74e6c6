/*
 * A stand-in for NVIDIA's libnvidia-ml.so.1, for tests on machines without an NVIDIA GPU or driver.
 *
 * It exports the subset of the NVML C API that pynvml (nvidia-ml-py) calls for device enumeration,
 * memory, processes, PCI, UUID, utilisation and driver version, with the same struct layouts.
 * Nothing is cached: every call re-reads the state, so a test can change the "hardware" live.
 *
 * Build:  cc -shared -fPIC -O1 -Wl,-soname,libnvidia-ml.so.1 -o DIR/libnvidia-ml.so.1 fake_nvml.c
 *
 * State file, named by $FAKE_NVML_STATE (unset or missing: nvmlInit* returns DRIVER_NOT_LOADED).
 * One directive per line; '#' starts a comment; unknown or malformed lines are ignored.
 *
 *   gpu INDEX TOTAL_MIB BASE_USED_MIB PCI_BUS_ID NAME...   NAME is the rest of the line
 *   proc GPU_INDEX PID USED_MIB                           USED_MIB may be `na` (not available)
 *   util GPU_INDEX GPU_PERCENT [MEMORY_PERCENT]
 *   driver VERSION                                         default 999.99.99
 *   noprocs                      nvmlDeviceGetComputeRunningProcesses* return NOT_SUPPORTED
 *   fail init                    nvmlInit* return UNKNOWN
 *   fail memory                  nvmlDeviceGetMemoryInfo* return GPU_IS_LOST
 *
 * Device enumeration is by INDEX: nvmlDeviceGetCount is the number of `gpu` lines and
 * nvmlDeviceGetHandleByIndex(i) finds the line with INDEX i, so write indices 0..N-1.
 * A handle whose gpu line has since disappeared gives GPU_IS_LOST.
 *
 * Dynamic processes: when $FAKE_NVML_PROCS_DIR is set, each regular file there named by a pid
 * (digits only) holds lines `GPU_INDEX USED_MIB`. Files of pids that are gone (kill(pid, 0) fails
 * with ESRCH) or are zombies are ignored, as a dead process's GPU memory is freed.
 *
 * used = BASE_USED + every numeric process amount on that GPU; free = total - used (at least 0).
 *
 * Besides NVML symbols it exports fakeNvmlReset() (drop the init count to 0) and fakeNvmlIsFake().
 */

#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <ctype.h>
#include <dirent.h>
#include <errno.h>
#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/stat.h>
#include <sys/types.h>

#define EXPORT __attribute__((visibility("default")))

typedef int nvmlReturn_t;

enum {
    NVML_SUCCESS = 0,
    NVML_ERROR_UNINITIALIZED = 1,
    NVML_ERROR_INVALID_ARGUMENT = 2,
    NVML_ERROR_NOT_SUPPORTED = 3,
    NVML_ERROR_NO_PERMISSION = 4,
    NVML_ERROR_ALREADY_INITIALIZED = 5,
    NVML_ERROR_NOT_FOUND = 6,
    NVML_ERROR_INSUFFICIENT_SIZE = 7,
    NVML_ERROR_INSUFFICIENT_POWER = 8,
    NVML_ERROR_DRIVER_NOT_LOADED = 9,
    NVML_ERROR_TIMEOUT = 10,
    NVML_ERROR_IRQ_ISSUE = 11,
    NVML_ERROR_LIBRARY_NOT_FOUND = 12,
    NVML_ERROR_FUNCTION_NOT_FOUND = 13,
    NVML_ERROR_CORRUPTED_INFOROM = 14,
    NVML_ERROR_GPU_IS_LOST = 15,
    NVML_ERROR_RESET_REQUIRED = 16,
    NVML_ERROR_OPERATING_SYSTEM = 17,
    NVML_ERROR_LIB_RM_VERSION_MISMATCH = 18,
    NVML_ERROR_IN_USE = 19,
    NVML_ERROR_MEMORY = 20,
    NVML_ERROR_NO_DATA = 21,
    NVML_ERROR_ARGUMENT_VERSION_MISMATCH = 25,
    NVML_ERROR_UNKNOWN = 999,
};

#define NVML_VALUE_NOT_AVAILABLE_ULL 0xFFFFFFFFFFFFFFFFULL
#define MIB 1048576.0

#define MAX_GPUS 16
#define MAX_PROCS 256
#define NAME_LEN 96 /* NVML_DEVICE_NAME_V2_BUFFER_SIZE */
#define BUS_ID_LEN 32 /* NVML_DEVICE_PCI_BUS_ID_BUFFER_SIZE */
#define BUS_ID_LEGACY_LEN 16 /* NVML_DEVICE_PCI_BUS_ID_BUFFER_V2_SIZE */
#define DRIVER_LEN 80 /* NVML_SYSTEM_DRIVER_VERSION_BUFFER_SIZE */

/* ---- public structs, laid out as in nvml.h / pynvml ---- */

typedef struct {
    unsigned long long total;
    unsigned long long free;
    unsigned long long used;
} nvmlMemory_t;

typedef struct {
    unsigned int version;
    unsigned long long total;
    unsigned long long reserved;
    unsigned long long free;
    unsigned long long used;
} nvmlMemory_v2_t;

#define NVML_STRUCT_VERSION(size, ver) ((unsigned int)(size) | ((unsigned int)(ver) << 24))
#define nvmlMemory_v2 NVML_STRUCT_VERSION(sizeof(nvmlMemory_v2_t), 2)

typedef struct {
    unsigned int pid;
    unsigned long long usedGpuMemory;
} nvmlProcessInfo_v1_t;

typedef struct {
    unsigned int pid;
    unsigned long long usedGpuMemory;
    unsigned int gpuInstanceId;
    unsigned int computeInstanceId;
} nvmlProcessInfo_v2_t; /* also the layout of the _v3 calls' nvmlProcessInfo_t */

typedef struct {
    char busIdLegacy[BUS_ID_LEGACY_LEN];
    unsigned int domain;
    unsigned int bus;
    unsigned int device;
    unsigned int pciDeviceId;
    unsigned int pciSubSystemId;
    char busId[BUS_ID_LEN];
} nvmlPciInfo_t; /* the _v2 and _v3 layout */

typedef struct {
    char busId[BUS_ID_LEGACY_LEN];
    unsigned int domain;
    unsigned int bus;
    unsigned int device;
    unsigned int pciDeviceId;
    unsigned int pciSubSystemId;
    unsigned int reserved0, reserved1, reserved2, reserved3;
} nvmlPciInfo_v1_t;

typedef struct {
    unsigned int gpu;
    unsigned int memory;
} nvmlUtilization_t;

/* A device handle points at one of these; only its index matters, the rest is read per call. */
struct fake_device {
    unsigned int index;
};
typedef struct fake_device *nvmlDevice_t;

static struct fake_device devices[MAX_GPUS] = {
    {0}, {1}, {2}, {3}, {4}, {5}, {6}, {7}, {8}, {9}, {10}, {11}, {12}, {13}, {14}, {15},
};

static int init_count;

/* ---- state ---- */

struct gpu {
    int present;
    unsigned long long total_mib;
    double base_used_mib;
    char bus_id[BUS_ID_LEN];
    char name[NAME_LEN];
    unsigned int util_gpu, util_memory;
};

struct proc {
    unsigned int gpu;
    unsigned int pid;
    int available; /* 0: usedGpuMemory is NVML_VALUE_NOT_AVAILABLE */
    double used_mib;
};

struct state {
    struct gpu gpus[MAX_GPUS];
    unsigned int gpu_count;
    struct proc procs[MAX_PROCS];
    unsigned int proc_count;
    int no_procs, fail_init, fail_memory;
    char driver[DRIVER_LEN];
};

static char *skip_space(char *s) {
    while (*s && isspace((unsigned char)*s)) s++;
    return s;
}

static char *next_word(char **cursor) {
    char *s = skip_space(*cursor);
    if (!*s) return NULL;
    char *start = s;
    while (*s && !isspace((unsigned char)*s)) s++;
    if (*s) *s++ = '\0';
    *cursor = s;
    return start;
}

static int parse_uint(const char *word, unsigned long long *out) {
    if (!word || !isdigit((unsigned char)word[0])) return 0;
    char *end;
    errno = 0;
    unsigned long long v = strtoull(word, &end, 10);
    if (errno || *end) return 0;
    *out = v;
    return 1;
}

static int parse_amount(const char *word, double *out) {
    if (!word || !(isdigit((unsigned char)word[0]) || word[0] == '.')) return 0;
    char *end;
    errno = 0;
    double v = strtod(word, &end);
    if (errno || *end || !isfinite(v) || v < 0) return 0;
    *out = v;
    return 1;
}

static void rstrip(char *s) {
    size_t n = strlen(s);
    while (n && isspace((unsigned char)s[n - 1])) s[--n] = '\0';
}

static void copy_str(char *dst, size_t size, const char *src) {
    snprintf(dst, size, "%s", src);
}

/* Add (or merge into an existing entry for the same gpu and pid) one process's usage. */
static void add_proc(struct state *st, unsigned int gpu, unsigned int pid, int available, double mib) {
    for (unsigned int i = 0; i < st->proc_count; i++) {
        struct proc *p = &st->procs[i];
        if (p->gpu == gpu && p->pid == pid) {
            if (available) {
                p->used_mib = (p->available ? p->used_mib : 0) + mib;
                p->available = 1;
            }
            return;
        }
    }
    if (st->proc_count >= MAX_PROCS) return;
    struct proc *p = &st->procs[st->proc_count++];
    p->gpu = gpu;
    p->pid = pid;
    p->available = available;
    p->used_mib = available ? mib : 0;
}

static void parse_line(struct state *st, char *line) {
    char *hash = strchr(line, '#');
    if (hash) *hash = '\0';
    char *cursor = line;
    char *word = next_word(&cursor);
    if (!word) return;

    if (strcmp(word, "gpu") == 0) {
        unsigned long long index, total;
        double used;
        if (!parse_uint(next_word(&cursor), &index) || index >= MAX_GPUS) return;
        if (!parse_uint(next_word(&cursor), &total)) return;
        if (!parse_amount(next_word(&cursor), &used)) return;
        char *bus = next_word(&cursor);
        if (!bus) return;
        char *name = skip_space(cursor);
        rstrip(name);
        struct gpu *g = &st->gpus[index];
        if (!g->present) st->gpu_count++;
        g->present = 1;
        g->total_mib = total;
        g->base_used_mib = used;
        copy_str(g->bus_id, sizeof g->bus_id, bus);
        copy_str(g->name, sizeof g->name, *name ? name : "NVIDIA Fake GPU");
    } else if (strcmp(word, "proc") == 0) {
        unsigned long long gpu, pid;
        double used = 0;
        if (!parse_uint(next_word(&cursor), &gpu) || gpu >= MAX_GPUS) return;
        if (!parse_uint(next_word(&cursor), &pid) || pid > 0xFFFFFFFFULL) return;
        char *amount = next_word(&cursor);
        if (!amount) return;
        if (strcmp(amount, "na") == 0) {
            add_proc(st, (unsigned)gpu, (unsigned)pid, 0, 0);
        } else if (parse_amount(amount, &used)) {
            add_proc(st, (unsigned)gpu, (unsigned)pid, 1, used);
        }
    } else if (strcmp(word, "util") == 0) {
        unsigned long long gpu, pct, mem_pct = 0;
        if (!parse_uint(next_word(&cursor), &gpu) || gpu >= MAX_GPUS) return;
        if (!parse_uint(next_word(&cursor), &pct)) return;
        char *mem = next_word(&cursor);
        if (mem && !parse_uint(mem, &mem_pct)) return;
        st->gpus[gpu].util_gpu = (unsigned)(pct > 100 ? 100 : pct);
        st->gpus[gpu].util_memory = (unsigned)(mem_pct > 100 ? 100 : mem_pct);
    } else if (strcmp(word, "driver") == 0) {
        char *version = next_word(&cursor);
        if (version) copy_str(st->driver, sizeof st->driver, version);
    } else if (strcmp(word, "noprocs") == 0) {
        st->no_procs = 1;
    } else if (strcmp(word, "fail") == 0) {
        char *what = next_word(&cursor);
        if (!what) return;
        if (strcmp(what, "init") == 0) st->fail_init = 1;
        if (strcmp(what, "memory") == 0) st->fail_memory = 1;
    }
}

/* Alive and not a zombie: a zombie holds no GPU memory, even before its parent reaps it. */
static int pid_alive(unsigned int pid) {
    if (pid == 0) return 0;
    if (kill((pid_t)pid, 0) != 0 && errno == ESRCH) return 0;
    char path[64], buf[512];
    snprintf(path, sizeof path, "/proc/%u/stat", pid);
    FILE *f = fopen(path, "r");
    if (!f) return 1;
    size_t n = fread(buf, 1, sizeof buf - 1, f);
    fclose(f);
    buf[n] = '\0';
    char *paren = strrchr(buf, ')');
    if (paren && paren[1] == ' ' && (paren[2] == 'Z' || paren[2] == 'X')) return 0;
    return 1;
}

static int digits_only(const char *s) {
    if (!*s) return 0;
    for (; *s; s++)
        if (!isdigit((unsigned char)*s)) return 0;
    return 1;
}

static int by_name(const struct dirent **a, const struct dirent **b) {
    unsigned long long x = strtoull((*a)->d_name, NULL, 10), y = strtoull((*b)->d_name, NULL, 10);
    return x < y ? -1 : x > y;
}

static int pid_file(const struct dirent *e) {
    return digits_only(e->d_name) && strlen(e->d_name) <= 10;
}

static void read_dynamic(struct state *st, const char *dir) {
    struct dirent **entries;
    int n = scandir(dir, &entries, pid_file, by_name);
    if (n < 0) return;
    for (int i = 0; i < n; i++) {
        unsigned long long pid = strtoull(entries[i]->d_name, NULL, 10);
        char path[4096];
        snprintf(path, sizeof path, "%s/%s", dir, entries[i]->d_name);
        free(entries[i]);
        struct stat sb;
        if (pid > 0xFFFFFFFFULL || stat(path, &sb) != 0 || !S_ISREG(sb.st_mode)) continue;
        if (!pid_alive((unsigned)pid)) continue;
        FILE *f = fopen(path, "r");
        if (!f) continue;
        char *line = NULL;
        size_t cap = 0;
        while (getline(&line, &cap, f) >= 0) {
            char *hash = strchr(line, '#');
            if (hash) *hash = '\0';
            char *cursor = line;
            unsigned long long gpu;
            double used;
            if (!parse_uint(next_word(&cursor), &gpu) || gpu >= MAX_GPUS) continue;
            if (!parse_amount(next_word(&cursor), &used)) continue;
            add_proc(st, (unsigned)gpu, (unsigned)pid, 1, used);
        }
        free(line);
        fclose(f);
    }
    free(entries);
}

/* 1 when the state was read; 0 when there is none (variable unset or file missing). */
static int load_state(struct state *st) {
    memset(st, 0, sizeof *st);
    copy_str(st->driver, sizeof st->driver, "999.99.99");
    const char *path = getenv("FAKE_NVML_STATE");
    if (!path || !*path) return 0;
    FILE *f = fopen(path, "r");
    if (!f) return 0;
    char *line = NULL;
    size_t cap = 0;
    while (getline(&line, &cap, f) >= 0) parse_line(st, line);
    free(line);
    fclose(f);
    const char *dir = getenv("FAKE_NVML_PROCS_DIR");
    if (dir && *dir) read_dynamic(st, dir);
    return 1;
}

static int initialized(void) {
    return __atomic_load_n(&init_count, __ATOMIC_SEQ_CST) > 0;
}

/* Common prologue of every query: initialised, state readable. */
#define LOAD_OR_RETURN(st)                                   \
    do {                                                     \
        if (!initialized()) return NVML_ERROR_UNINITIALIZED; \
        if (!load_state(st)) return NVML_ERROR_UNKNOWN;      \
    } while (0)

/* Resolve a handle to its gpu in the freshly read state. */
static nvmlReturn_t lookup(struct state *st, nvmlDevice_t device, struct gpu **out) {
    if (!initialized()) return NVML_ERROR_UNINITIALIZED;
    if (!device || device < devices || device >= devices + MAX_GPUS) return NVML_ERROR_INVALID_ARGUMENT;
    if (!load_state(st)) return NVML_ERROR_UNKNOWN;
    struct gpu *g = &st->gpus[device->index];
    if (!g->present) return NVML_ERROR_GPU_IS_LOST;
    *out = g;
    return NVML_SUCCESS;
}

static nvmlReturn_t put_string(char *dst, unsigned int length, const char *src) {
    if (!dst) return NVML_ERROR_INVALID_ARGUMENT;
    if (strlen(src) + 1 > length) return NVML_ERROR_INSUFFICIENT_SIZE;
    memcpy(dst, src, strlen(src) + 1);
    return NVML_SUCCESS;
}

/* ---- init / shutdown / errors ---- */

EXPORT nvmlReturn_t nvmlInitWithFlags(unsigned int flags) {
    (void)flags;
    struct state st;
    if (!load_state(&st)) return NVML_ERROR_DRIVER_NOT_LOADED;
    if (st.fail_init) return NVML_ERROR_UNKNOWN;
    __atomic_add_fetch(&init_count, 1, __ATOMIC_SEQ_CST);
    return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlInit_v2(void) { return nvmlInitWithFlags(0); }
EXPORT nvmlReturn_t nvmlInit(void) { return nvmlInitWithFlags(0); }

EXPORT nvmlReturn_t nvmlShutdown(void) {
    int seen = __atomic_load_n(&init_count, __ATOMIC_SEQ_CST);
    while (seen > 0) {
        if (__atomic_compare_exchange_n(&init_count, &seen, seen - 1, 0, __ATOMIC_SEQ_CST, __ATOMIC_SEQ_CST))
            return NVML_SUCCESS;
    }
    return NVML_ERROR_UNINITIALIZED;
}

EXPORT const char *nvmlErrorString(nvmlReturn_t result) {
    switch (result) {
    case NVML_SUCCESS: return "Success";
    case NVML_ERROR_UNINITIALIZED: return "Uninitialized";
    case NVML_ERROR_INVALID_ARGUMENT: return "Invalid Argument";
    case NVML_ERROR_NOT_SUPPORTED: return "Not Supported";
    case NVML_ERROR_NO_PERMISSION: return "Insufficient Permissions";
    case NVML_ERROR_ALREADY_INITIALIZED: return "Already Initialized";
    case NVML_ERROR_NOT_FOUND: return "Not Found";
    case NVML_ERROR_INSUFFICIENT_SIZE: return "Insufficient Size";
    case NVML_ERROR_INSUFFICIENT_POWER: return "Insufficient External Power";
    case NVML_ERROR_DRIVER_NOT_LOADED: return "Driver Not Loaded";
    case NVML_ERROR_TIMEOUT: return "Timeout";
    case NVML_ERROR_IRQ_ISSUE: return "Interrupt Request Issue";
    case NVML_ERROR_LIBRARY_NOT_FOUND: return "NVML Shared Library Not Found";
    case NVML_ERROR_FUNCTION_NOT_FOUND: return "Function Not Found";
    case NVML_ERROR_CORRUPTED_INFOROM: return "Corrupted infoROM";
    case NVML_ERROR_GPU_IS_LOST: return "GPU is lost";
    case NVML_ERROR_RESET_REQUIRED: return "GPU requires restart";
    case NVML_ERROR_OPERATING_SYSTEM: return "The operating system has blocked the request.";
    case NVML_ERROR_LIB_RM_VERSION_MISMATCH: return "RM has detected an NVML/RM version mismatch.";
    case NVML_ERROR_IN_USE: return "In use by another client";
    case NVML_ERROR_MEMORY: return "Insufficient Memory";
    case NVML_ERROR_NO_DATA: return "No data";
    case NVML_ERROR_ARGUMENT_VERSION_MISMATCH: return "Argument version mismatch";
    case NVML_ERROR_UNKNOWN: return "Unknown Error";
    default: return "Unknown Error";
    }
}

/* Not part of NVML: lets a test start from "not initialised" whatever earlier tests did. */
EXPORT void fakeNvmlReset(void) { __atomic_store_n(&init_count, 0, __ATOMIC_SEQ_CST); }
EXPORT int fakeNvmlIsFake(void) { return 1; }

/* ---- system ---- */

EXPORT nvmlReturn_t nvmlSystemGetDriverVersion(char *version, unsigned int length) {
    struct state st;
    LOAD_OR_RETURN(&st);
    return put_string(version, length, st.driver);
}

EXPORT nvmlReturn_t nvmlSystemGetNVMLVersion(char *version, unsigned int length) {
    struct state st;
    LOAD_OR_RETURN(&st);
    char buf[DRIVER_LEN + 8];
    snprintf(buf, sizeof buf, "13.%s", st.driver);
    return put_string(version, length, buf);
}

EXPORT nvmlReturn_t nvmlSystemGetCudaDriverVersion(int *version) {
    struct state st;
    LOAD_OR_RETURN(&st);
    if (!version) return NVML_ERROR_INVALID_ARGUMENT;
    *version = 12040;
    return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlSystemGetCudaDriverVersion_v2(int *version) {
    return nvmlSystemGetCudaDriverVersion(version);
}

/* ---- enumeration ---- */

EXPORT nvmlReturn_t nvmlDeviceGetCount_v2(unsigned int *count) {
    struct state st;
    LOAD_OR_RETURN(&st);
    if (!count) return NVML_ERROR_INVALID_ARGUMENT;
    *count = st.gpu_count;
    return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlDeviceGetCount(unsigned int *count) { return nvmlDeviceGetCount_v2(count); }

EXPORT nvmlReturn_t nvmlDeviceGetHandleByIndex_v2(unsigned int index, nvmlDevice_t *device) {
    struct state st;
    LOAD_OR_RETURN(&st);
    if (!device || index >= MAX_GPUS || !st.gpus[index].present) return NVML_ERROR_INVALID_ARGUMENT;
    *device = &devices[index];
    return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlDeviceGetHandleByIndex(unsigned int index, nvmlDevice_t *device) {
    return nvmlDeviceGetHandleByIndex_v2(index, device);
}

static void uuid_of(unsigned int index, char *buf, size_t size) {
    snprintf(buf, size, "GPU-fake-%04u", index);
}

EXPORT nvmlReturn_t nvmlDeviceGetHandleByUUID(const char *uuid, nvmlDevice_t *device) {
    struct state st;
    LOAD_OR_RETURN(&st);
    if (!uuid || !device) return NVML_ERROR_INVALID_ARGUMENT;
    for (unsigned int i = 0; i < MAX_GPUS; i++) {
        char buf[32];
        uuid_of(i, buf, sizeof buf);
        if (st.gpus[i].present && strcmp(buf, uuid) == 0) {
            *device = &devices[i];
            return NVML_SUCCESS;
        }
    }
    return NVML_ERROR_NOT_FOUND;
}

EXPORT nvmlReturn_t nvmlDeviceGetHandleByPciBusId_v2(const char *bus_id, nvmlDevice_t *device) {
    struct state st;
    LOAD_OR_RETURN(&st);
    if (!bus_id || !device) return NVML_ERROR_INVALID_ARGUMENT;
    for (unsigned int i = 0; i < MAX_GPUS; i++) {
        if (st.gpus[i].present && strcasecmp(st.gpus[i].bus_id, bus_id) == 0) {
            *device = &devices[i];
            return NVML_SUCCESS;
        }
    }
    return NVML_ERROR_NOT_FOUND;
}

EXPORT nvmlReturn_t nvmlDeviceGetHandleByPciBusId(const char *bus_id, nvmlDevice_t *device) {
    return nvmlDeviceGetHandleByPciBusId_v2(bus_id, device);
}

EXPORT nvmlReturn_t nvmlDeviceGetIndex(nvmlDevice_t device, unsigned int *index) {
    struct state st;
    struct gpu *g;
    nvmlReturn_t ret = lookup(&st, device, &g);
    if (ret != NVML_SUCCESS) return ret;
    if (!index) return NVML_ERROR_INVALID_ARGUMENT;
    *index = device->index;
    return NVML_SUCCESS;
}

/* ---- identity ---- */

EXPORT nvmlReturn_t nvmlDeviceGetName(nvmlDevice_t device, char *name, unsigned int length) {
    struct state st;
    struct gpu *g;
    nvmlReturn_t ret = lookup(&st, device, &g);
    if (ret != NVML_SUCCESS) return ret;
    return put_string(name, length, g->name);
}

EXPORT nvmlReturn_t nvmlDeviceGetUUID(nvmlDevice_t device, char *uuid, unsigned int length) {
    struct state st;
    struct gpu *g;
    nvmlReturn_t ret = lookup(&st, device, &g);
    if (ret != NVML_SUCCESS) return ret;
    char buf[32];
    uuid_of(device->index, buf, sizeof buf);
    return put_string(uuid, length, buf);
}

static void fill_pci(const struct gpu *g, unsigned int *domain, unsigned int *bus, unsigned int *dev) {
    *domain = *bus = *dev = 0;
    unsigned int function = 0;
    if (sscanf(g->bus_id, "%x:%x:%x.%x", domain, bus, dev, &function) != 4) {
        *domain = 0;
        if (sscanf(g->bus_id, "%x:%x.%x", bus, dev, &function) != 3) *bus = *dev = 0;
    }
}

EXPORT nvmlReturn_t nvmlDeviceGetPciInfo_v3(nvmlDevice_t device, nvmlPciInfo_t *pci) {
    struct state st;
    struct gpu *g;
    nvmlReturn_t ret = lookup(&st, device, &g);
    if (ret != NVML_SUCCESS) return ret;
    if (!pci) return NVML_ERROR_INVALID_ARGUMENT;
    memset(pci, 0, sizeof *pci);
    fill_pci(g, &pci->domain, &pci->bus, &pci->device);
    pci->pciDeviceId = 0x000010DE;
    pci->pciSubSystemId = 0x000010DE;
    snprintf(pci->busIdLegacy, sizeof pci->busIdLegacy, "%04x:%02x:%02x.0", pci->domain & 0xFFFF,
             pci->bus & 0xFF, pci->device & 0xFF);
    copy_str(pci->busId, sizeof pci->busId, g->bus_id);
    return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlDeviceGetPciInfo_v2(nvmlDevice_t device, nvmlPciInfo_t *pci) {
    return nvmlDeviceGetPciInfo_v3(device, pci);
}

EXPORT nvmlReturn_t nvmlDeviceGetPciInfo(nvmlDevice_t device, nvmlPciInfo_v1_t *pci) {
    nvmlPciInfo_t full;
    nvmlReturn_t ret = nvmlDeviceGetPciInfo_v3(device, &full);
    if (ret != NVML_SUCCESS) return ret;
    memset(pci, 0, sizeof *pci);
    memcpy(pci->busId, full.busIdLegacy, sizeof pci->busId);
    pci->domain = full.domain;
    pci->bus = full.bus;
    pci->device = full.device;
    pci->pciDeviceId = full.pciDeviceId;
    pci->pciSubSystemId = full.pciSubSystemId;
    return NVML_SUCCESS;
}

/* ---- memory ---- */

static void memory_of(const struct state *st, unsigned int index, unsigned long long *total,
                      unsigned long long *used, unsigned long long *free_) {
    const struct gpu *g = &st->gpus[index];
    double used_mib = g->base_used_mib;
    for (unsigned int i = 0; i < st->proc_count; i++)
        if (st->procs[i].gpu == index && st->procs[i].available) used_mib += st->procs[i].used_mib;
    *total = g->total_mib * 1048576ULL;
    double used_bytes = used_mib * MIB;
    *used = used_bytes >= 1.8e19 ? NVML_VALUE_NOT_AVAILABLE_ULL - 1 : (unsigned long long)(used_bytes + 0.5);
    *free_ = *used >= *total ? 0 : *total - *used;
}

EXPORT nvmlReturn_t nvmlDeviceGetMemoryInfo(nvmlDevice_t device, nvmlMemory_t *memory) {
    struct state st;
    struct gpu *g;
    nvmlReturn_t ret = lookup(&st, device, &g);
    if (ret != NVML_SUCCESS) return ret;
    if (!memory) return NVML_ERROR_INVALID_ARGUMENT;
    if (st.fail_memory) return NVML_ERROR_GPU_IS_LOST;
    memory_of(&st, device->index, &memory->total, &memory->used, &memory->free);
    return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlDeviceGetMemoryInfo_v2(nvmlDevice_t device, nvmlMemory_v2_t *memory) {
    struct state st;
    struct gpu *g;
    nvmlReturn_t ret = lookup(&st, device, &g);
    if (ret != NVML_SUCCESS) return ret;
    if (!memory) return NVML_ERROR_INVALID_ARGUMENT;
    if (memory->version != nvmlMemory_v2) return NVML_ERROR_ARGUMENT_VERSION_MISMATCH;
    if (st.fail_memory) return NVML_ERROR_GPU_IS_LOST;
    memory->reserved = 0;
    memory_of(&st, device->index, &memory->total, &memory->used, &memory->free);
    return NVML_SUCCESS;
}

/* ---- utilisation ---- */

EXPORT nvmlReturn_t nvmlDeviceGetUtilizationRates(nvmlDevice_t device, nvmlUtilization_t *utilization) {
    struct state st;
    struct gpu *g;
    nvmlReturn_t ret = lookup(&st, device, &g);
    if (ret != NVML_SUCCESS) return ret;
    if (!utilization) return NVML_ERROR_INVALID_ARGUMENT;
    utilization->gpu = g->util_gpu;
    utilization->memory = g->util_memory;
    return NVML_SUCCESS;
}

/* ---- processes ---- */

/*
 * NVML's sizing protocol: *count < needed gives INSUFFICIENT_SIZE with *count = needed
 * (a first call with *count = 0 and no buffer is how callers ask); none running is SUCCESS, 0.
 * `version` 1 is the unversioned call's nvmlProcessInfo_v1_t, 2 the _v2/_v3 layout.
 */
static nvmlReturn_t compute_procs(nvmlDevice_t device, unsigned int *count, void *infos, int version) {
    struct state st;
    struct gpu *g;
    nvmlReturn_t ret = lookup(&st, device, &g);
    if (ret != NVML_SUCCESS) return ret;
    if (!count) return NVML_ERROR_INVALID_ARGUMENT;
    if (st.no_procs) return NVML_ERROR_NOT_SUPPORTED;
    unsigned int needed = 0;
    for (unsigned int i = 0; i < st.proc_count; i++)
        if (st.procs[i].gpu == device->index) needed++;
    if (*count < needed) {
        *count = needed;
        return NVML_ERROR_INSUFFICIENT_SIZE;
    }
    if (needed && !infos) return NVML_ERROR_INVALID_ARGUMENT;
    unsigned int n = 0;
    for (unsigned int i = 0; i < st.proc_count; i++) {
        const struct proc *p = &st.procs[i];
        if (p->gpu != device->index) continue;
        double bytes = p->used_mib * MIB + 0.5;
        unsigned long long used = !p->available ? NVML_VALUE_NOT_AVAILABLE_ULL
                                  : bytes >= 1.8e19 ? NVML_VALUE_NOT_AVAILABLE_ULL - 1
                                                    : (unsigned long long)bytes;
        if (version == 1) {
            nvmlProcessInfo_v1_t *out = (nvmlProcessInfo_v1_t *)infos + n;
            out->pid = p->pid;
            out->usedGpuMemory = used;
        } else {
            nvmlProcessInfo_v2_t *out = (nvmlProcessInfo_v2_t *)infos + n;
            out->pid = p->pid;
            out->usedGpuMemory = used;
            out->gpuInstanceId = 0xFFFFFFFFu; /* no MIG */
            out->computeInstanceId = 0xFFFFFFFFu;
        }
        n++;
    }
    *count = n;
    return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlDeviceGetComputeRunningProcesses_v3(nvmlDevice_t device, unsigned int *count,
                                                            nvmlProcessInfo_v2_t *infos) {
    return compute_procs(device, count, infos, 3);
}

EXPORT nvmlReturn_t nvmlDeviceGetComputeRunningProcesses_v2(nvmlDevice_t device, unsigned int *count,
                                                            nvmlProcessInfo_v2_t *infos) {
    return compute_procs(device, count, infos, 2);
}

EXPORT nvmlReturn_t nvmlDeviceGetComputeRunningProcesses(nvmlDevice_t device, unsigned int *count,
                                                         nvmlProcessInfo_v1_t *infos) {
    return compute_procs(device, count, infos, 1);
}

static nvmlReturn_t no_procs(nvmlDevice_t device, unsigned int *count) {
    struct state st;
    struct gpu *g;
    nvmlReturn_t ret = lookup(&st, device, &g);
    if (ret != NVML_SUCCESS) return ret;
    if (!count) return NVML_ERROR_INVALID_ARGUMENT;
    *count = 0;
    return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlDeviceGetGraphicsRunningProcesses_v3(nvmlDevice_t device, unsigned int *count,
                                                             nvmlProcessInfo_v2_t *infos) {
    (void)infos;
    return no_procs(device, count);
}

EXPORT nvmlReturn_t nvmlDeviceGetGraphicsRunningProcesses_v2(nvmlDevice_t device, unsigned int *count,
                                                             nvmlProcessInfo_v2_t *infos) {
    (void)infos;
    return no_procs(device, count);
}

EXPORT nvmlReturn_t nvmlDeviceGetGraphicsRunningProcesses(nvmlDevice_t device, unsigned int *count,
                                                          nvmlProcessInfo_v1_t *infos) {
    (void)infos;
    return no_procs(device, count);
}
