/*
 * A driver-shaped libnvidia-ml.so.1 for tests: every NVML entry point FlopWatch's backend reaches,
 * defined against NVIDIA's own nvml.h (the compiler rejects any prototype that differs from the
 * header, so the ABI the real nvidia-ml-py calls through is the header's).
 *
 * It checks what the driver checks: an initialised session, handles it issued (and from the
 * current reset and driver epoch), struct version fields, buffer lengths (INSUFFICIENT_SIZE with
 * the needed count), GPM sample pairs taken from one device in order. It answers in the driver's
 * units: mW, mJ, MHz, ns, percent, KiB for NVLink data, bytes for PCIe counters.
 *
 * GPUs and faults come from a state file (path in FLOPWATCH_NVML_STATE; written by DriverState in
 * __init__.py), re-read whenever it changes, so a test or a running agent sees a GPU fall off the
 * bus, an XID arrive, a function answer NOT_SUPPORTED, a call hang or the driver restart. Lines:
 *   driver V | nvml V | epoch N (bump: driver reloaded) | init_error CODE
 *   clock SECONDS (the counters' clock, set by the test; absent or 0: CLOCK_MONOTONIC)
 *   gpus COUNT MODEL (A100, H100, H200, B200) | xid GPU CODE (in delivery order)
 *   gpu INDEX, then for that GPU: KEY VALUE (see KEYS; NVML units) | fail FUNCTION CODE |
 *   hang FUNCTION SECONDS | field_error FIELD SCOPE CODE | violation POLICY NS | pids P... | name/uuid TEXT
 * Without a state file it serves 8 healthy H100s.
 */
#include <errno.h>
#include <math.h>
#include <pthread.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>

#include "nvml.h"

#define MAX_GPUS 64
#define MAX_HANDLES 4096
#define MAX_SETS 64
#define MAX_SAMPLES 1024
#define MAX_FAILS 32
#define MAX_XIDS 4096
#define MAX_PIDS 16
#define MAX_FIELD_ERRORS 32
#define NAME_LEN 64
#define GPM_COUNT 4
#define HANDLE_MAGIC 0x6e766d6cu
#define SUPPORTED_EVENTS (nvmlEventTypeXidCriticalError | nvmlEventTypeSingleBitEccError | \
                          nvmlEventTypeDoubleBitEccError)

/* ---- configuration (from the state file) ------------------------------------------------- */
struct model {
    const char *key, *name;
    long long sm_max_mhz, mem_mhz, power_limit_mw, memory_total, links, pcie_gen, gpm;
};

static const struct model MODELS[] = {
    {"A100", "NVIDIA A100-SXM4-80GB", 1410, 1593, 400000, 85899345920LL, 12, 4, 0},
    {"H100", "NVIDIA H100 80GB HBM3", 1980, 2619, 700000, 85520809984LL, 18, 5, 1},
    {"H200", "NVIDIA H200", 1980, 3201, 700000, 150754820096LL, 18, 5, 1},
    {"B200", "NVIDIA B200", 1965, 3996, 1000000, 192265846784LL, 18, 5, 1},
};

struct fail { char function[NAME_LEN]; int code; double hang_s; };
struct field_error { unsigned field, scope; int code; };

struct gpu_cfg {
    char name[96], uuid[96];
    long long lost, reset, links, gpm, ecc;
    long long util_gpu, util_mem, sm_mhz, sm_max_mhz, mem_mhz, power_mw, power_limit_mw;
    long long energy_base_mj, temp_c, mem_temp_c, memory_total, memory_used;
    long long clock_reasons, supported_reasons, pcie_gen, pcie_width, pcie_max_gen, pcie_max_width;
    long long pcie_replays, pcie_tx, pcie_rx, pcie_tx_bps, pcie_rx_bps, nvlink_kibps;
    long long ecc_corrected, ecc_uncorrected, remap_corr, remap_unc, remap_pending, remap_failure;
    long long gpm_pct[GPM_COUNT];
    long long viol_ns[NVML_PERF_POLICY_COUNT];   /* -1: not supported */
    long long pids[MAX_PIDS], npids;
    struct fail fails[MAX_FAILS]; int nfails;
    struct field_error field_errors[MAX_FIELD_ERRORS]; int nfield_errors;
};

struct state {
    char driver[80], nvml[80];
    long long cuda, epoch, init_error;
    double clock;
    int ngpus;
    struct gpu_cfg gpus[MAX_GPUS];
    int nxids;
    int xid_gpu[MAX_XIDS];
    unsigned long long xid_code[MAX_XIDS];
};

/* ---- runtime ------------------------------------------------------------------------------ */
struct nvmlDevice_st { unsigned magic; int index; long long reset, epoch; };
struct nvmlEventSet_st { int used; int cursor; unsigned long long types[MAX_GPUS]; nvmlDevice_t reg[MAX_GPUS]; };
struct nvmlGpmSample_st {
    int used, filled, index; long long reset; unsigned long long seq; double t; double acc[GPM_COUNT];
};
struct integral { double t, energy_mj, gpm[GPM_COUNT], pcie_tx, pcie_rx, nvlink_kib; };

static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
static struct state st;
static struct integral run[MAX_GPUS];
static struct nvmlDevice_st handles[MAX_HANDLES];
static int nhandles;
static struct nvmlEventSet_st sets[MAX_SETS];
static struct nvmlGpmSample_st samples[MAX_SAMPLES];
static unsigned long long sample_seq;
static int refcount;
static long long session_epoch = -1;
static int loaded;
static struct stat seen;

static const unsigned GPM_IDS[GPM_COUNT] = {
    NVML_GPM_METRIC_SM_UTIL, NVML_GPM_METRIC_SM_OCCUPANCY, NVML_GPM_METRIC_ANY_TENSOR_UTIL,
    NVML_GPM_METRIC_DRAM_BW_UTIL,
};

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static long long wall_us(void) {
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (long long)ts.tv_sec * 1000000LL + ts.tv_nsec / 1000;
}

static void sleep_s(double seconds) {
    struct timespec ts = {(time_t)seconds, (long)((seconds - (double)(time_t)seconds) * 1e9)};
    while (nanosleep(&ts, &ts) == -1 && errno == EINTR) {}
}

/* ---- call counters: read by tests through flopwatch_nvml_calls() ---------------------------- */
struct counter { const char *name; unsigned long long count; };
static struct counter counters[96];
static int ncounters;

static void count_call(const char *name) {
    for (int i = 0; i < ncounters; i++)
        if (counters[i].name == name || strcmp(counters[i].name, name) == 0) { counters[i].count++; return; }
    if (ncounters < (int)(sizeof counters / sizeof counters[0])) counters[ncounters++] = (struct counter){name, 1};
}

unsigned long long flopwatch_nvml_calls(const char *name) {
    unsigned long long count = 0;
    pthread_mutex_lock(&mu);
    for (int i = 0; i < ncounters; i++)   /* "*": every entry point together */
        if (strcmp(name, "*") == 0 || strcmp(counters[i].name, name) == 0) count += counters[i].count;
    pthread_mutex_unlock(&mu);
    return count;
}

/* Live GPM samples and event sets: a test checks nothing leaks across a re-initialisation. */
int flopwatch_nvml_live(const char *kind) {
    int live = 0;
    pthread_mutex_lock(&mu);
    if (strcmp(kind, "samples") == 0) for (int i = 0; i < MAX_SAMPLES; i++) live += samples[i].used;
    if (strcmp(kind, "event_sets") == 0) for (int i = 0; i < MAX_SETS; i++) live += sets[i].used;
    pthread_mutex_unlock(&mu);
    return live;
}

/* ---- state file ------------------------------------------------------------------------------ */
struct key { const char *name; size_t offset; };
#define K(field) {#field, offsetof(struct gpu_cfg, field)}
static const struct key KEYS[] = {
    K(lost), K(reset), K(links), K(gpm), K(ecc), K(util_gpu), K(util_mem), K(sm_mhz), K(sm_max_mhz),
    K(mem_mhz), K(power_mw), K(power_limit_mw), K(energy_base_mj), K(temp_c), K(mem_temp_c),
    K(memory_total), K(memory_used), K(clock_reasons), K(supported_reasons), K(pcie_gen), K(pcie_width),
    K(pcie_max_gen), K(pcie_max_width), K(pcie_replays), K(pcie_tx), K(pcie_rx), K(pcie_tx_bps),
    K(pcie_rx_bps), K(nvlink_kibps), K(ecc_corrected), K(ecc_uncorrected), K(remap_corr), K(remap_unc),
    K(remap_pending), K(remap_failure),
    {"sm_active", offsetof(struct gpu_cfg, gpm_pct[0])}, {"sm_occupancy", offsetof(struct gpu_cfg, gpm_pct[1])},
    {"tensor_active", offsetof(struct gpu_cfg, gpm_pct[2])}, {"dram_active", offsetof(struct gpu_cfg, gpm_pct[3])},
};

static void default_gpu(struct gpu_cfg *g, const struct model *m, int index) {
    memset(g, 0, sizeof *g);
    snprintf(g->name, sizeof g->name, "%s", m->name);
    snprintf(g->uuid, sizeof g->uuid, "GPU-fa11ed00-0000-4000-8000-%012d", index);
    g->links = m->links; g->gpm = m->gpm; g->ecc = 1;
    g->util_gpu = 97; g->util_mem = 41;
    g->sm_mhz = g->sm_max_mhz = m->sm_max_mhz; g->mem_mhz = m->mem_mhz;
    g->power_limit_mw = m->power_limit_mw; g->power_mw = m->power_limit_mw * 7 / 8;
    g->energy_base_mj = 123456789; g->temp_c = 61; g->mem_temp_c = 70;
    g->memory_total = m->memory_total; g->memory_used = m->memory_total / 4 * 3;
    g->supported_reasons = nvmlClocksEventReasonAll;
    g->pcie_gen = g->pcie_max_gen = m->pcie_gen; g->pcie_width = g->pcie_max_width = 16;
    g->pcie_replays = 3; g->pcie_tx = 7000000123LL; g->pcie_rx = 9000000456LL;
    g->ecc_corrected = 2; g->remap_corr = 1;
    g->gpm_pct[0] = 80; g->gpm_pct[1] = 35; g->gpm_pct[2] = 50; g->gpm_pct[3] = 30;
    g->viol_ns[NVML_PERF_POLICY_POWER] = 1500000000LL; g->viol_ns[NVML_PERF_POLICY_THERMAL] = 250000000LL;
    g->viol_ns[NVML_PERF_POLICY_LOW_UTILIZATION] = 9000000000LL;
    g->pids[0] = 4242; g->npids = 1;
}

static const struct model *model_of(const char *key) {
    for (size_t i = 0; i < sizeof MODELS / sizeof MODELS[0]; i++)
        if (strcmp(MODELS[i].key, key) == 0) return &MODELS[i];
    return NULL;
}

static void add_gpu(struct state *s, const char *model_key) {
    const struct model *m = model_of(model_key);
    if (m == NULL || s->ngpus >= MAX_GPUS) return;
    default_gpu(&s->gpus[s->ngpus], m, s->ngpus);
    s->ngpus++;
}

static void parse_gpu_line(struct gpu_cfg *g, const char *word, const char *rest) {
    char a[NAME_LEN] = "";
    long long v = 0;
    double seconds = 0;
    unsigned field = 0, scope = 0;
    int code = 0;
    if (strcmp(word, "fail") == 0 && g->nfails < MAX_FAILS && sscanf(rest, "%63s %d", a, &code) == 2) {
        g->fails[g->nfails++] = (struct fail){"", code, 0};
        snprintf(g->fails[g->nfails - 1].function, NAME_LEN, "%s", a);
    } else if (strcmp(word, "hang") == 0 && g->nfails < MAX_FAILS && sscanf(rest, "%63s %lf", a, &seconds) == 2) {
        g->fails[g->nfails++] = (struct fail){"", 0, seconds};
        snprintf(g->fails[g->nfails - 1].function, NAME_LEN, "%s", a);
    } else if (strcmp(word, "field_error") == 0 && g->nfield_errors < MAX_FIELD_ERRORS &&
               sscanf(rest, "%u %u %d", &field, &scope, &code) == 3) {
        g->field_errors[g->nfield_errors++] = (struct field_error){field, scope, code};
    } else if (strcmp(word, "violation") == 0 && sscanf(rest, "%u %lld", &field, &v) == 2 &&
               field < NVML_PERF_POLICY_COUNT) {
        g->viol_ns[field] = v;
    } else if (strcmp(word, "pids") == 0) {
        int used = 0, n = 0;
        g->npids = 0;
        while (g->npids < MAX_PIDS && sscanf(rest + used, "%lld%n", &v, &n) == 1) { g->pids[g->npids++] = v; used += n; }
    } else if (strcmp(word, "name") == 0) {
        snprintf(g->name, sizeof g->name, "%s", rest);
    } else if (strcmp(word, "uuid") == 0) {
        snprintf(g->uuid, sizeof g->uuid, "%s", rest);
    } else if (sscanf(rest, "%lld", &v) == 1) {
        for (size_t i = 0; i < sizeof KEYS / sizeof KEYS[0]; i++)
            if (strcmp(KEYS[i].name, word) == 0) *(long long *)((char *)g + KEYS[i].offset) = v;
    }
}

static void parse(FILE *file, struct state *s) {
    char line[512], word[NAME_LEN], rest[448], model[NAME_LEN];
    int count = 0, gpu = -1;
    unsigned long long code = 0;
    memset(s, 0, sizeof *s);
    snprintf(s->driver, sizeof s->driver, "550.54.15");
    snprintf(s->nvml, sizeof s->nvml, "12.550.54.15");
    s->cuda = 12040;
    while (file != NULL && fgets(line, sizeof line, file)) {
        line[strcspn(line, "\r\n#")] = 0;
        rest[0] = 0;
        if (sscanf(line, " %63s %447[^\n]", word, rest) < 1) continue;
        if (strcmp(word, "gpus") == 0 && sscanf(rest, "%d %63s", &count, model) == 2) {
            while (count-- > 0) add_gpu(s, model);
        } else if (strcmp(word, "gpu") == 0 && sscanf(rest, "%d", &gpu) == 1) {
            if (gpu < 0 || gpu >= s->ngpus) gpu = -1;
        } else if (strcmp(word, "xid") == 0 && s->nxids < MAX_XIDS && sscanf(rest, "%d %llu", &count, &code) == 2) {
            s->xid_gpu[s->nxids] = count; s->xid_code[s->nxids++] = code;
        } else if (strcmp(word, "driver") == 0) { snprintf(s->driver, sizeof s->driver, "%s", rest);
        } else if (strcmp(word, "nvml") == 0) { snprintf(s->nvml, sizeof s->nvml, "%s", rest);
        } else if (strcmp(word, "cuda") == 0) { s->cuda = atoll(rest);
        } else if (strcmp(word, "epoch") == 0) { s->epoch = atoll(rest);
        } else if (strcmp(word, "clock") == 0) { s->clock = atof(rest);
        } else if (strcmp(word, "init_error") == 0) { s->init_error = atoll(rest);
        } else if (gpu >= 0) { parse_gpu_line(&s->gpus[gpu], word, rest); }
    }
}

/* The time the counters integrate to: the state's clock when the test sets one. */
static double counters_now(const struct state *s) { return s->clock > 0 ? s->clock : now_s(); }

/* Advance every GPU's counters to `t` at the rates configured so far. */
static void integrate(double t) {
    for (int i = 0; i < st.ngpus; i++) {
        struct integral *r = &run[i];
        const struct gpu_cfg *g = &st.gpus[i];
        if (r->t == 0) r->t = t;
        double dt = t - r->t;
        r->energy_mj += (double)g->power_mw * dt;   /* mW x s = mJ */
        for (int k = 0; k < GPM_COUNT; k++) r->gpm[k] += (double)g->gpm_pct[k] * dt;
        r->pcie_tx += (double)g->pcie_tx_bps * dt;
        r->pcie_rx += (double)g->pcie_rx_bps * dt;
        r->nvlink_kib += (double)g->nvlink_kibps * dt;
        r->t = t;
    }
}

/* Called with mu held: re-read the state file when it changed (or on first use). */
static void reload(void) {
    const char *path = getenv("FLOPWATCH_NVML_STATE");
    struct stat now;
    static struct state fresh;
    if (path == NULL || stat(path, &now) != 0) {
        if (loaded) return;
        parse(NULL, &fresh);  /* no state file: 8 healthy H100s */
        for (int i = 0; i < 8; i++) add_gpu(&fresh, "H100");
    } else {
        if (loaded && now.st_ino == seen.st_ino && now.st_size == seen.st_size &&
            now.st_mtim.tv_sec == seen.st_mtim.tv_sec && now.st_mtim.tv_nsec == seen.st_mtim.tv_nsec) return;
        FILE *file = fopen(path, "r");
        if (file == NULL) return;
        parse(file, &fresh);
        fclose(file);
        seen = now;
    }
    integrate(counters_now(&fresh));   /* the old rates, up to the new state's time */
    st = fresh;
    loaded = 1;
}

/* ---- entry checks ----------------------------------------------------------------------------- */
static int live_session(void) { return refcount > 0 && session_epoch == st.epoch; }

static struct gpu_cfg *device_of(nvmlDevice_t device, nvmlReturn_t *ret) {
    if (!live_session()) { *ret = NVML_ERROR_UNINITIALIZED; return NULL; }
    if (device < handles || device >= handles + nhandles || device->magic != HANDLE_MAGIC) {
        *ret = NVML_ERROR_INVALID_ARGUMENT; return NULL;
    }
    if (device->epoch != st.epoch) { *ret = NVML_ERROR_UNINITIALIZED; return NULL; }
    if (device->index >= st.ngpus) { *ret = NVML_ERROR_GPU_IS_LOST; return NULL; }
    struct gpu_cfg *g = &st.gpus[device->index];
    if (g->lost || device->reset != g->reset) { *ret = NVML_ERROR_GPU_IS_LOST; return NULL; }
    *ret = NVML_SUCCESS;
    return g;
}

static double hang_of(const struct gpu_cfg *g, const char *function) {
    for (int i = 0; i < g->nfails; i++)
        if (g->fails[i].hang_s > 0 && strcmp(g->fails[i].function, function) == 0) return g->fails[i].hang_s;
    return 0;
}

/* Lock, count, validate the handle, serve an injected hang (unlocked) and an injected error.
 * On NVML_SUCCESS the lock is held and *out is the GPU; the caller answers, then UNLOCK(). */
static nvmlReturn_t enter(nvmlDevice_t device, const char *function, struct gpu_cfg **out) {
    nvmlReturn_t ret;
    pthread_mutex_lock(&mu);
    count_call(function);
    reload();
    struct gpu_cfg *g = device_of(device, &ret);
    double hang = g ? hang_of(g, function) : 0, waited = 0;
    while (g && hang > 0 && waited < hang) {     /* a hung call; rewriting the state ends it */
        pthread_mutex_unlock(&mu);
        sleep_s(0.01);
        waited += 0.01;
        pthread_mutex_lock(&mu);
        reload();
        g = device_of(device, &ret);
        hang = g ? hang_of(g, function) : 0;
    }
    if (g == NULL) { pthread_mutex_unlock(&mu); return ret; }
    for (int i = 0; i < g->nfails; i++)
        if (g->fails[i].code != 0 && strcmp(g->fails[i].function, function) == 0) {
            pthread_mutex_unlock(&mu);
            return (nvmlReturn_t)g->fails[i].code;
        }
    *out = g;
    return NVML_SUCCESS;
}

#define UNLOCK() pthread_mutex_unlock(&mu)
#define ENTER(device, g) \
    struct gpu_cfg *g = NULL; \
    { nvmlReturn_t entered_ = enter((device), __func__, &g); if (entered_ != NVML_SUCCESS) return entered_; }
#define REQUIRE(condition) do { if (!(condition)) { UNLOCK(); return NVML_ERROR_INVALID_ARGUMENT; } } while (0)

static nvmlReturn_t enter_session(const char *function) {
    pthread_mutex_lock(&mu);
    count_call(function);
    reload();
    if (!live_session()) { UNLOCK(); return NVML_ERROR_UNINITIALIZED; }
    return NVML_SUCCESS;
}
#define ENTER_SESSION() { nvmlReturn_t entered_ = enter_session(__func__); if (entered_ != NVML_SUCCESS) return entered_; }

static nvmlReturn_t copy_string(char *out, unsigned int length, const char *value) {
    if (out == NULL) return NVML_ERROR_INVALID_ARGUMENT;
    if (length < strlen(value) + 1) return NVML_ERROR_INSUFFICIENT_SIZE;
    memcpy(out, value, strlen(value) + 1);
    return NVML_SUCCESS;
}

static nvmlDevice_t handle_for(int index) {
    const struct gpu_cfg *g = &st.gpus[index];
    for (int i = 0; i < nhandles; i++)
        if (handles[i].index == index && handles[i].reset == g->reset && handles[i].epoch == st.epoch)
            return &handles[i];
    if (nhandles >= MAX_HANDLES) return NULL;
    handles[nhandles] = (struct nvmlDevice_st){HANDLE_MAGIC, index, g->reset, st.epoch};
    return &handles[nhandles++];
}

/* ---- library and system --------------------------------------------------------------------- */
nvmlReturn_t nvmlInitWithFlags(unsigned int flags) {
    (void)flags;
    pthread_mutex_lock(&mu);
    count_call(__func__);
    reload();
    if (st.init_error) { UNLOCK(); return (nvmlReturn_t)st.init_error; }
    if (refcount++ == 0) session_epoch = st.epoch;
    UNLOCK();
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlInit_v2(void) { return nvmlInitWithFlags(0); }

nvmlReturn_t nvmlShutdown(void) {
    pthread_mutex_lock(&mu);
    count_call(__func__);
    if (refcount == 0) { UNLOCK(); return NVML_ERROR_UNINITIALIZED; }
    if (--refcount == 0) session_epoch = -1;
    UNLOCK();
    return NVML_SUCCESS;
}

const char *nvmlErrorString(nvmlReturn_t result) {
    switch (result) {
    case NVML_SUCCESS: return "Success";
    case NVML_ERROR_UNINITIALIZED: return "Uninitialized";
    case NVML_ERROR_INVALID_ARGUMENT: return "Invalid Argument";
    case NVML_ERROR_NOT_SUPPORTED: return "Not Supported";
    case NVML_ERROR_INSUFFICIENT_SIZE: return "Insufficient Size";
    case NVML_ERROR_TIMEOUT: return "Timeout";
    case NVML_ERROR_GPU_IS_LOST: return "GPU is lost";
    case NVML_ERROR_ARGUMENT_VERSION_MISMATCH: return "Argument version mismatch";
    default: return "Unknown Error";
    }
}

nvmlReturn_t nvmlSystemGetDriverVersion(char *version, unsigned int length) {
    ENTER_SESSION();
    nvmlReturn_t ret = copy_string(version, length, st.driver);
    UNLOCK();
    return ret;
}

nvmlReturn_t nvmlSystemGetNVMLVersion(char *version, unsigned int length) {
    ENTER_SESSION();
    nvmlReturn_t ret = copy_string(version, length, st.nvml);
    UNLOCK();
    return ret;
}

nvmlReturn_t nvmlSystemGetCudaDriverVersion(int *cudaDriverVersion) {
    ENTER_SESSION();
    REQUIRE(cudaDriverVersion != NULL);
    *cudaDriverVersion = (int)st.cuda;
    UNLOCK();
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlSystemGetCudaDriverVersion_v2(int *cudaDriverVersion) {
    return nvmlSystemGetCudaDriverVersion(cudaDriverVersion);
}

nvmlReturn_t nvmlDeviceGetCount_v2(unsigned int *deviceCount) {
    ENTER_SESSION();
    REQUIRE(deviceCount != NULL);
    *deviceCount = (unsigned)st.ngpus;
    UNLOCK();
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetHandleByIndex_v2(unsigned int index, nvmlDevice_t *device) {
    ENTER_SESSION();
    REQUIRE(device != NULL && index < (unsigned)st.ngpus);
    if (st.gpus[index].lost) { UNLOCK(); return NVML_ERROR_GPU_IS_LOST; }
    *device = handle_for((int)index);
    UNLOCK();
    return *device ? NVML_SUCCESS : NVML_ERROR_MEMORY;
}

nvmlReturn_t nvmlDeviceGetHandleByUUID(const char *uuid, nvmlDevice_t *device) {
    ENTER_SESSION();
    REQUIRE(uuid != NULL && device != NULL);
    for (int i = 0; i < st.ngpus; i++) {
        if (strcmp(st.gpus[i].uuid, uuid) != 0) continue;
        if (st.gpus[i].lost) { UNLOCK(); return NVML_ERROR_GPU_IS_LOST; }
        *device = handle_for(i);
        UNLOCK();
        return *device ? NVML_SUCCESS : NVML_ERROR_MEMORY;
    }
    UNLOCK();
    return NVML_ERROR_NOT_FOUND;
}

/* ---- identity and fixed facts ---------------------------------------------------------------- */
nvmlReturn_t nvmlDeviceGetUUID(nvmlDevice_t device, char *uuid, unsigned int length) {
    ENTER(device, g);
    nvmlReturn_t ret = copy_string(uuid, length, g->uuid);
    UNLOCK();
    return ret;
}

nvmlReturn_t nvmlDeviceGetName(nvmlDevice_t device, char *name, unsigned int length) {
    ENTER(device, g);
    nvmlReturn_t ret = copy_string(name, length, g->name);
    UNLOCK();
    return ret;
}

static nvmlReturn_t clock_of(const struct gpu_cfg *g, nvmlClockType_t type, int max, unsigned int *clock) {
    if (clock == NULL) return NVML_ERROR_INVALID_ARGUMENT;
    switch (type) {
    case NVML_CLOCK_GRAPHICS: case NVML_CLOCK_SM: *clock = (unsigned)(max ? g->sm_max_mhz : g->sm_mhz); break;
    case NVML_CLOCK_MEM: *clock = (unsigned)g->mem_mhz; break;
    case NVML_CLOCK_VIDEO: *clock = (unsigned)(max ? 1980 : 1755); break;
    default: return NVML_ERROR_INVALID_ARGUMENT;
    }
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetMaxClockInfo(nvmlDevice_t device, nvmlClockType_t type, unsigned int *clock) {
    ENTER(device, g);
    nvmlReturn_t ret = clock_of(g, type, 1, clock);
    UNLOCK();
    return ret;
}

nvmlReturn_t nvmlDeviceGetClockInfo(nvmlDevice_t device, nvmlClockType_t type, unsigned int *clock) {
    ENTER(device, g);
    nvmlReturn_t ret = clock_of(g, type, 0, clock);
    UNLOCK();
    return ret;
}

/* One unsigned-int answer from a GPU field: the shape of a dozen NVML getters. */
#define UINT_GETTER(function, expr) \
    nvmlReturn_t function(nvmlDevice_t device, unsigned int *value) { \
        ENTER(device, g); REQUIRE(value != NULL); *value = (unsigned)(expr); UNLOCK(); return NVML_SUCCESS; }
#define ULL_GETTER(function, expr) \
    nvmlReturn_t function(nvmlDevice_t device, unsigned long long *value) { \
        ENTER(device, g); REQUIRE(value != NULL); *value = (unsigned long long)(expr); UNLOCK(); return NVML_SUCCESS; }

UINT_GETTER(nvmlDeviceGetMaxPcieLinkGeneration, g->pcie_max_gen)
UINT_GETTER(nvmlDeviceGetMaxPcieLinkWidth, g->pcie_max_width)
UINT_GETTER(nvmlDeviceGetCurrPcieLinkGeneration, g->pcie_gen)
UINT_GETTER(nvmlDeviceGetCurrPcieLinkWidth, g->pcie_width)
UINT_GETTER(nvmlDeviceGetPowerUsage, g->power_mw)
UINT_GETTER(nvmlDeviceGetEnforcedPowerLimit, g->power_limit_mw)
ULL_GETTER(nvmlDeviceGetSupportedClocksEventReasons, g->supported_reasons)
ULL_GETTER(nvmlDeviceGetCurrentClocksEventReasons, g->clock_reasons & g->supported_reasons)

nvmlReturn_t nvmlDeviceGetTotalEnergyConsumption(nvmlDevice_t device, unsigned long long *energy) {
    ENTER(device, g);
    REQUIRE(energy != NULL);
    integrate(counters_now(&st));
    *energy = (unsigned long long)g->energy_base_mj + (unsigned long long)run[device->index].energy_mj;
    UNLOCK();
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetNvLinkState(nvmlDevice_t device, unsigned int link, nvmlEnableState_t *isActive) {
    ENTER(device, g);
    REQUIRE(isActive != NULL && link < NVML_NVLINK_MAX_LINKS);
    if (g->links == 0) { UNLOCK(); return NVML_ERROR_NOT_SUPPORTED; }
    REQUIRE(link < (unsigned)g->links);
    *isActive = NVML_FEATURE_ENABLED;
    UNLOCK();
    return NVML_SUCCESS;
}

/* ---- dynamic readings ------------------------------------------------------------------------ */
nvmlReturn_t nvmlDeviceGetUtilizationRates(nvmlDevice_t device, nvmlUtilization_t *utilization) {
    ENTER(device, g);
    REQUIRE(utilization != NULL);
    utilization->gpu = (unsigned)g->util_gpu;
    utilization->memory = (unsigned)g->util_mem;
    UNLOCK();
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetMemoryInfo(nvmlDevice_t device, nvmlMemory_t *memory) {
    ENTER(device, g);
    REQUIRE(memory != NULL);
    memory->total = (unsigned long long)g->memory_total;
    memory->used = (unsigned long long)g->memory_used;
    memory->free = memory->total - memory->used;
    UNLOCK();
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetTemperature(nvmlDevice_t device, nvmlTemperatureSensors_t sensorType, unsigned int *temp) {
    ENTER(device, g);
    REQUIRE(temp != NULL && sensorType == NVML_TEMPERATURE_GPU);
    *temp = (unsigned)g->temp_c;
    UNLOCK();
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetViolationStatus(nvmlDevice_t device, nvmlPerfPolicyType_t perfPolicyType,
                                          nvmlViolationTime_t *violTime) {
    ENTER(device, g);
    REQUIRE(violTime != NULL && (unsigned)perfPolicyType < NVML_PERF_POLICY_COUNT);
    if (g->viol_ns[perfPolicyType] < 0) { UNLOCK(); return NVML_ERROR_NOT_SUPPORTED; }
    violTime->referenceTime = (unsigned long long)wall_us();
    violTime->violationTime = (unsigned long long)g->viol_ns[perfPolicyType];
    UNLOCK();
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetPcieThroughput(nvmlDevice_t device, nvmlPcieUtilCounter_t counter, unsigned int *value) {
    ENTER(device, g);
    REQUIRE(value != NULL && (unsigned)counter < NVML_PCIE_UTIL_COUNT);
    UNLOCK();
    sleep_s(0.02);   /* the driver samples for 20 ms: the reason FlopWatch never calls it */
    *value = 0;
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetTotalEccErrors(nvmlDevice_t device, nvmlMemoryErrorType_t errorType,
                                         nvmlEccCounterType_t counterType, unsigned long long *eccCounts) {
    ENTER(device, g);
    REQUIRE(eccCounts != NULL && (unsigned)errorType < NVML_MEMORY_ERROR_TYPE_COUNT &&
            (unsigned)counterType < NVML_ECC_COUNTER_TYPE_COUNT);
    if (!g->ecc) { UNLOCK(); return NVML_ERROR_NOT_SUPPORTED; }
    *eccCounts = (unsigned long long)(errorType == NVML_MEMORY_ERROR_TYPE_CORRECTED ? g->ecc_corrected
                                                                                    : g->ecc_uncorrected);
    UNLOCK();
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetRemappedRows(nvmlDevice_t device, unsigned int *corrRows, unsigned int *uncRows,
                                       unsigned int *isPending, unsigned int *failureOccurred) {
    ENTER(device, g);
    REQUIRE(corrRows != NULL && uncRows != NULL && isPending != NULL && failureOccurred != NULL);
    *corrRows = (unsigned)g->remap_corr;
    *uncRows = (unsigned)g->remap_unc;
    *isPending = (unsigned)g->remap_pending;
    *failureOccurred = (unsigned)g->remap_failure;
    UNLOCK();
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetComputeRunningProcesses_v3(nvmlDevice_t device, unsigned int *infoCount,
                                                     nvmlProcessInfo_t *infos) {
    ENTER(device, g);
    REQUIRE(infoCount != NULL);
    unsigned needed = (unsigned)g->npids;
    if (*infoCount < needed || (needed > 0 && infos == NULL)) {
        *infoCount = needed;   /* the caller asks again with room for this many */
        UNLOCK();
        return NVML_ERROR_INSUFFICIENT_SIZE;
    }
    for (unsigned i = 0; i < needed; i++)
        infos[i] = (nvmlProcessInfo_t){(unsigned)g->pids[i], 1ULL << 30, 0xFFFFFFFFu, 0xFFFFFFFFu};
    *infoCount = needed;
    UNLOCK();
    return NVML_SUCCESS;
}

/* ---- field values ------------------------------------------------------------------------------ */
static void answer_field(const struct gpu_cfg *g, const struct integral *r, nvmlFieldValue_t *v) {
    unsigned scope = v->scopeId;
    double per_link = r->nvlink_kib;
    v->nvmlReturn = NVML_SUCCESS;
    v->valueType = NVML_VALUE_TYPE_UNSIGNED_LONG_LONG;
    for (int i = 0; i < g->nfield_errors; i++)
        if (g->field_errors[i].field == v->fieldId && g->field_errors[i].scope == scope) {
            v->nvmlReturn = (nvmlReturn_t)g->field_errors[i].code;
            return;
        }
    switch (v->fieldId) {
    case NVML_FI_DEV_MEMORY_TEMP:
        if (g->mem_temp_c < 0) { v->nvmlReturn = NVML_ERROR_NOT_SUPPORTED; return; }
        v->valueType = NVML_VALUE_TYPE_UNSIGNED_INT; v->value.uiVal = (unsigned)g->mem_temp_c; return;
    case NVML_FI_DEV_PCIE_REPLAY_COUNTER: v->value.ullVal = (unsigned long long)g->pcie_replays; return;
    case NVML_FI_DEV_PCIE_COUNT_TX_BYTES: v->value.ullVal = (unsigned long long)(g->pcie_tx + r->pcie_tx); return;
    case NVML_FI_DEV_PCIE_COUNT_RX_BYTES: v->value.ullVal = (unsigned long long)(g->pcie_rx + r->pcie_rx); return;
    case NVML_FI_DEV_NVLINK_LINK_COUNT:
        v->valueType = NVML_VALUE_TYPE_UNSIGNED_INT; v->value.uiVal = (unsigned)g->links; return;
    case NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX: case NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_RX:
    case NVML_FI_DEV_NVLINK_ERROR_DL_REPLAY: case NVML_FI_DEV_NVLINK_ERROR_DL_RECOVERY:
    case NVML_FI_DEV_NVLINK_ERROR_DL_CRC:
        if (g->links == 0) { v->nvmlReturn = NVML_ERROR_NOT_SUPPORTED; return; }
        if (scope >= (unsigned)g->links) { v->nvmlReturn = NVML_ERROR_INVALID_ARGUMENT; return; }
        break;
    default: v->nvmlReturn = NVML_ERROR_NOT_SUPPORTED; return;
    }
    unsigned long long link = scope;
    switch (v->fieldId) {   /* KiB for data, counts for errors */
    case NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX: v->value.ullVal = 1000 * (link + 1) + (unsigned long long)per_link; break;
    case NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_RX: v->value.ullVal = 2000 * (link + 1) + (unsigned long long)per_link; break;
    case NVML_FI_DEV_NVLINK_ERROR_DL_REPLAY: v->value.ullVal = 10 + link; break;
    case NVML_FI_DEV_NVLINK_ERROR_DL_RECOVERY: v->value.ullVal = 20 + link; break;
    default: v->value.ullVal = 30 + link; break;
    }
}

nvmlReturn_t nvmlDeviceGetFieldValues(nvmlDevice_t device, int valuesCount, nvmlFieldValue_t *values) {
    ENTER(device, g);
    REQUIRE(values != NULL && valuesCount > 0);
    integrate(counters_now(&st));
    long long stamp = wall_us();
    for (int i = 0; i < valuesCount; i++) {
        values[i].timestamp = stamp;
        values[i].latencyUsec = 0;
        answer_field(g, &run[device->index], &values[i]);
    }
    UNLOCK();
    return NVML_SUCCESS;
}

/* ---- GPM ------------------------------------------------------------------------------------------ */
nvmlReturn_t nvmlGpmQueryDeviceSupport(nvmlDevice_t device, nvmlGpmSupport_t *gpmSupport) {
    ENTER(device, g);
    REQUIRE(gpmSupport != NULL);
    if (gpmSupport->version != NVML_GPM_SUPPORT_VERSION) { UNLOCK(); return NVML_ERROR_ARGUMENT_VERSION_MISMATCH; }
    gpmSupport->isSupportedDevice = (unsigned)(g->gpm != 0);
    UNLOCK();
    return NVML_SUCCESS;
}

static struct nvmlGpmSample_st *sample_of(nvmlGpmSample_t sample) {
    if (sample < samples || sample >= samples + MAX_SAMPLES || !sample->used) return NULL;
    return sample;
}

nvmlReturn_t nvmlGpmSampleAlloc(nvmlGpmSample_t *gpmSample) {
    ENTER_SESSION();
    REQUIRE(gpmSample != NULL);
    for (int i = 0; i < MAX_SAMPLES; i++) {
        if (samples[i].used) continue;
        samples[i] = (struct nvmlGpmSample_st){.used = 1, .index = -1};
        *gpmSample = &samples[i];
        UNLOCK();
        return NVML_SUCCESS;
    }
    UNLOCK();
    return NVML_ERROR_MEMORY;
}

nvmlReturn_t nvmlGpmSampleFree(nvmlGpmSample_t gpmSample) {
    pthread_mutex_lock(&mu);   /* freeing is plain memory: allowed after the session ended too */
    count_call(__func__);
    struct nvmlGpmSample_st *s = sample_of(gpmSample);
    REQUIRE(s != NULL);
    s->used = 0;
    UNLOCK();
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlGpmSampleGet(nvmlDevice_t device, nvmlGpmSample_t gpmSample) {
    ENTER(device, g);
    struct nvmlGpmSample_st *s = sample_of(gpmSample);
    REQUIRE(s != NULL);
    if (!g->gpm) { UNLOCK(); return NVML_ERROR_NOT_SUPPORTED; }
    integrate(counters_now(&st));
    s->filled = 1;
    s->index = device->index;
    s->reset = device->reset;
    s->seq = ++sample_seq;
    s->t = run[device->index].t;
    memcpy(s->acc, run[device->index].gpm, sizeof s->acc);
    UNLOCK();
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlGpmMetricsGet(nvmlGpmMetricsGet_t *metricsGet) {
    ENTER_SESSION();
    REQUIRE(metricsGet != NULL);
    if (metricsGet->version != NVML_GPM_METRICS_GET_VERSION) { UNLOCK(); return NVML_ERROR_ARGUMENT_VERSION_MISMATCH; }
    struct nvmlGpmSample_st *first = sample_of(metricsGet->sample1), *second = sample_of(metricsGet->sample2);
    REQUIRE(metricsGet->numMetrics <= NVML_GPM_METRIC_MAX && first && second && first->filled && second->filled);
    /* a pair: one device, same reset, the older sample first, apart in time */
    REQUIRE(first->index == second->index && first->reset == second->reset && first->seq < second->seq &&
            second->t > first->t);
    double dt = second->t - first->t;
    for (unsigned i = 0; i < metricsGet->numMetrics; i++) {
        nvmlGpmMetric_t *metric = &metricsGet->metrics[i];
        metric->nvmlReturn = NVML_ERROR_NOT_SUPPORTED;
        for (int k = 0; k < GPM_COUNT; k++)
            if (metric->metricId == GPM_IDS[k]) {
                metric->value = (second->acc[k] - first->acc[k]) / dt;
                metric->nvmlReturn = NVML_SUCCESS;
            }
    }
    UNLOCK();
    return NVML_SUCCESS;
}

/* ---- events ------------------------------------------------------------------------------------- */
static struct nvmlEventSet_st *set_of(nvmlEventSet_t set) {
    if (set < sets || set >= sets + MAX_SETS || !set->used) return NULL;
    return set;
}

nvmlReturn_t nvmlEventSetCreate(nvmlEventSet_t *set) {
    ENTER_SESSION();
    REQUIRE(set != NULL);
    for (int i = 0; i < MAX_SETS; i++) {
        if (sets[i].used) continue;
        memset(&sets[i], 0, sizeof sets[i]);
        sets[i].used = 1;
        sets[i].cursor = st.nxids;   /* events from before the set existed are not delivered */
        *set = &sets[i];
        UNLOCK();
        return NVML_SUCCESS;
    }
    UNLOCK();
    return NVML_ERROR_MEMORY;
}

nvmlReturn_t nvmlDeviceRegisterEvents(nvmlDevice_t device, unsigned long long eventTypes, nvmlEventSet_t set) {
    ENTER(device, g);
    (void)g;
    struct nvmlEventSet_st *s = set_of(set);
    REQUIRE(s != NULL);
    if (eventTypes & ~(unsigned long long)SUPPORTED_EVENTS) { UNLOCK(); return NVML_ERROR_NOT_SUPPORTED; }
    s->types[device->index] |= eventTypes;
    s->reg[device->index] = device;
    UNLOCK();
    return NVML_SUCCESS;
}

/* Called with mu held: the next undelivered XID of a GPU registered on this set, if any. */
static int next_event(struct nvmlEventSet_st *s, nvmlEventData_t *data) {
    while (s->cursor < st.nxids) {
        int i = s->cursor++, gpu = st.xid_gpu[i];
        if (gpu < 0 || gpu >= MAX_GPUS || !(s->types[gpu] & nvmlEventTypeXidCriticalError)) continue;
        data->device = s->reg[gpu];
        data->eventType = nvmlEventTypeXidCriticalError;
        data->eventData = st.xid_code[i];
        data->gpuInstanceId = 0xFFFFFFFFu;
        data->computeInstanceId = 0xFFFFFFFFu;
        return 1;
    }
    return 0;
}

nvmlReturn_t nvmlEventSetWait_v2(nvmlEventSet_t set, nvmlEventData_t *data, unsigned int timeoutms) {
    ENTER_SESSION();
    REQUIRE(data != NULL && set_of(set) != NULL);
    double deadline = now_s() + timeoutms / 1000.0;
    for (;;) {
        if (next_event(set, data)) { UNLOCK(); return NVML_SUCCESS; }
        if (now_s() >= deadline) { UNLOCK(); return NVML_ERROR_TIMEOUT; }
        UNLOCK();
        sleep_s(0.005);
        pthread_mutex_lock(&mu);
        reload();
        if (!live_session()) { UNLOCK(); return NVML_ERROR_UNINITIALIZED; }
        if (set_of(set) == NULL) { UNLOCK(); return NVML_ERROR_INVALID_ARGUMENT; }
    }
}

nvmlReturn_t nvmlEventSetFree(nvmlEventSet_t set) {
    pthread_mutex_lock(&mu);
    count_call(__func__);
    struct nvmlEventSet_st *s = set_of(set);
    REQUIRE(s != NULL);
    s->used = 0;
    UNLOCK();
    return NVML_SUCCESS;
}
