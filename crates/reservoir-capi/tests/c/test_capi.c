/* The Reservoir C API from C, on the simulated device: normal use, threads,
 * and every bad input (each answered with an error code and a message
 * naming the bad value, with the statistics unchanged); host memory briefly.
 *
 * Run by tests/c_program.rs (cargo test -p reservoir-capi --test c_program);
 * usage: test_capi SCRATCH_DIR. The last line is the summary the Rust test
 * checks: "capi-c: N checks, F failed". */
#include "reservoir.h"

#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int checks = 0, failed = 0;

#define CHECK(cond, ...)                                                   \
    do {                                                                   \
        checks++;                                                          \
        if (!(cond)) {                                                     \
            failed++;                                                      \
            fprintf(stderr, "FAIL %s:%d: %s: ", __FILE__, __LINE__, #cond); \
            fprintf(stderr, __VA_ARGS__);                                  \
            fprintf(stderr, "\n");                                         \
        }                                                                  \
    } while (0)

#define OK(call)                                                                  \
    do {                                                                          \
        ReservoirStatus s_ = (call);                                              \
        CHECK(s_ == RESERVOIR_OK, "%s -> %s: %s", #call, reservoir_status_name(s_), \
              reservoir_last_error());                                            \
    } while (0)

/* `call` answers `code` with a last error containing `needle`. */
#define EXPECT_ERR(call, code, needle)                                             \
    do {                                                                           \
        ReservoirStatus s_ = (call);                                               \
        const char *m_ = reservoir_last_error();                                   \
        CHECK(s_ == (code), "%s -> %s (want %s): %s", #call, reservoir_status_name(s_), \
              reservoir_status_name(code), m_);                                    \
        CHECK(strstr(m_, (needle)) != NULL, "%s: message %s lacks \"%s\"", #call, m_, \
              (needle));                                                           \
    } while (0)

enum { MAX_STATS = 512, KEY_LEN = 128 };

typedef struct {
    size_t n;
    char keys[MAX_STATS][KEY_LEN];
    int64_t values[MAX_STATS];
} Stats;

static void read_stats(ReservoirAllocator *h, Stats *s) {
    OK(reservoir_allocator_stats_count(h, &s->n));
    CHECK(s->n > 0 && s->n <= MAX_STATS, "%zu statistics", s->n);
    for (size_t i = 0; i < s->n && i < MAX_STATS; i++) {
        size_t len = 0;
        OK(reservoir_allocator_stat_at(h, i, s->keys[i], KEY_LEN, &len, &s->values[i]));
        CHECK(len == strlen(s->keys[i]), "key length %zu", len);
    }
}

/* Every statistic is as in `before`. */
static void same_stats(ReservoirAllocator *h, const Stats *before, const char *after_what) {
    static Stats now;
    read_stats(h, &now);
    CHECK(now.n == before->n, "after %s: %zu statistics, was %zu", after_what, now.n, before->n);
    for (size_t i = 0; i < now.n && i < before->n; i++) {
        CHECK(strcmp(now.keys[i], before->keys[i]) == 0 && now.values[i] == before->values[i],
              "after %s: %s = %lld, was %s = %lld", after_what, now.keys[i],
              (long long)now.values[i], before->keys[i], (long long)before->values[i]);
    }
}

static int64_t stat(ReservoirAllocator *h, const char *key) {
    int64_t v = -1;
    OK(reservoir_allocator_stat(h, key, &v));
    return v;
}

static const uint64_t MiB = 1 << 20;

static void normal_use(const char *dir) {
    ReservoirAllocator *h = NULL;
    OK(reservoir_allocator_create(RESERVOIR_BACKEND_SIM, 0, 1024 * MiB, "max_split_size_mb:64", &h));
    CHECK(h != NULL, "handle");

    void *a = NULL, *b = NULL;
    OK(reservoir_allocator_alloc(h, 1 * MiB, 0, &a));
    OK(reservoir_allocator_alloc(h, 3 * MiB, 0, &b));
    CHECK(a != NULL && b != NULL && a != b, "pointers %p %p", a, b);
    CHECK(stat(h, "allocated_bytes.all.current") == (int64_t)(4 * MiB), "allocated");
    /* 1 MiB from a 2 MiB small segment, 3 MiB from a 20 MiB large one. */
    CHECK(stat(h, "reserved_bytes.all.current") == (int64_t)(22 * MiB), "reserved");
    OK(reservoir_allocator_free(h, a));
    OK(reservoir_allocator_free(h, b));
    CHECK(stat(h, "allocated_bytes.all.current") == 0, "allocated after free");
    CHECK(stat(h, "reserved_bytes.all.current") == (int64_t)(22 * MiB), "cached");
    OK(reservoir_allocator_empty_cache(h));
    CHECK(stat(h, "reserved_bytes.all.current") == 0, "reserved after empty_cache");

    /* Streams and record_stream. */
    uint64_t s1 = 0, s2 = 0;
    OK(reservoir_allocator_create_stream(h, &s1));
    OK(reservoir_allocator_create_stream(h, &s2));
    CHECK(s1 != s2, "streams %llu %llu", (unsigned long long)s1, (unsigned long long)s2);
    OK(reservoir_allocator_alloc(h, 5 * MiB, s1, &a));
    OK(reservoir_allocator_record_stream(h, a, s2));
    OK(reservoir_allocator_free(h, a));
    OK(reservoir_allocator_empty_cache(h));
    CHECK(stat(h, "allocated_bytes.all.current") == 0, "stream block freed");

    /* Memory fraction. */
    double f = 0;
    OK(reservoir_allocator_memory_fraction(h, &f));
    CHECK(f == 1.0, "fraction %g", f);
    OK(reservoir_allocator_set_memory_fraction(h, 0.5));
    OK(reservoir_allocator_memory_fraction(h, &f));
    CHECK(fabs(f - 0.5) < 1e-9, "fraction %g", f);
    EXPECT_ERR(reservoir_allocator_alloc(h, 600 * MiB, 0, &a), RESERVOIR_ERR_OUT_OF_MEMORY,
               "out of memory");
    CHECK(a == NULL, "failed alloc writes null");
    OK(reservoir_allocator_set_memory_fraction(h, 1.0));

    /* History and a snapshot file. */
    OK(reservoir_allocator_record_history(h, true, 1000));
    OK(reservoir_allocator_alloc(h, 4096, 0, &a));
    char path[4096];
    snprintf(path, sizeof path, "%s/snapshot.pickle", dir);
    OK(reservoir_allocator_snapshot(h, path));
    FILE *fp = fopen(path, "rb");
    CHECK(fp != NULL, "snapshot file %s", path);
    if (fp) {
        int first = fgetc(fp);
        CHECK(first == 0x80, "pickle starts with PROTO, got %d", first);
        fclose(fp);
    }
    /* A path that is not UTF-8 (Linux paths are bytes). */
    snprintf(path, sizeof path, "%s/snap\xff\xfe.pickle", dir);
    OK(reservoir_allocator_snapshot(h, path));
    fp = fopen(path, "rb");
    CHECK(fp != NULL, "snapshot file with a non-UTF-8 name");
    if (fp) {
        CHECK(fgetc(fp) == 0x80, "pickle starts with PROTO");
        fclose(fp);
        remove(path);
    }
    EXPECT_ERR(reservoir_allocator_snapshot(h, ""), RESERVOIR_ERR_INVALID_ARGUMENT, "path is empty");
    OK(reservoir_allocator_record_history(h, false, 0));
    OK(reservoir_allocator_free(h, a));

    /* Statistics by index, and a buffer too small. */
    Stats s;
    read_stats(h, &s);
    int found = 0;
    for (size_t i = 0; i < s.n; i++) found += strcmp(s.keys[i], "num_alloc_retries") == 0;
    CHECK(found == 1, "num_alloc_retries listed");
    char small[4];
    size_t len = 0;
    int64_t v = 0;
    EXPECT_ERR(reservoir_allocator_stat_at(h, 0, small, sizeof small, &len, &v),
               RESERVOIR_ERR_BUFFER_TOO_SMALL, "buffer has 4");
    CHECK(len == strlen(s.keys[0]), "needed length reported: %zu", len);

    OK(reservoir_allocator_destroy(h));
}

/* Host memory: real pointers, writable, released on free + empty_cache. */
static void host_memory(void) {
    ReservoirAllocator *h = NULL;
    OK(reservoir_allocator_create(RESERVOIR_BACKEND_HOST, 0, 256 * MiB, NULL, &h));
    void *p = NULL;
    OK(reservoir_allocator_alloc(h, 3 * MiB, 0, &p));
    if (p != NULL) {
        memset(p, 0xab, 3 * MiB);
        CHECK(((unsigned char *)p)[3 * MiB - 1] == 0xab, "host memory is writable");
    }
    void *q = NULL;
    EXPECT_ERR(reservoir_allocator_alloc(h, 300 * MiB, 0, &q), RESERVOIR_ERR_OUT_OF_MEMORY,
               "314572800");
    EXPECT_ERR(reservoir_allocator_alloc(h, 16, 12345, &q), RESERVOIR_ERR_INVALID_ARGUMENT,
               "stream 12345");
    EXPECT_ERR(reservoir_allocator_record_stream(h, p, 999), RESERVOIR_ERR_INVALID_ARGUMENT,
               "stream 999");
    uint64_t hs = 0;
    OK(reservoir_allocator_create_stream(h, &hs));
    OK(reservoir_allocator_record_stream(h, p, hs));
    OK(reservoir_allocator_free(h, p));
    OK(reservoir_allocator_empty_cache(h));
    CHECK(stat(h, "reserved_bytes.all.current") == 0, "host memory released");
    OK(reservoir_allocator_destroy(h));
}

enum { THREADS = 4, ROUNDS = 2000, HELD = 8 };

typedef struct {
    ReservoirAllocator *h;
    uint64_t stream;
    unsigned seed;
    int errors;
} Worker;

static void *work(void *arg) {
    Worker *w = arg;
    void *held[HELD] = {0};
    for (int i = 0; i < ROUNDS; i++) {
        int slot = rand_r(&w->seed) % HELD;
        if (held[slot] != NULL) {
            w->errors += reservoir_allocator_free(w->h, held[slot]) != RESERVOIR_OK;
            held[slot] = NULL;
        } else {
            uint64_t size = 1 + rand_r(&w->seed) % (3 * MiB);
            w->errors += reservoir_allocator_alloc(w->h, size, w->stream, &held[slot]) != RESERVOIR_OK;
        }
        if (i % 500 == 0) w->errors += reservoir_allocator_empty_cache(w->h) != RESERVOIR_OK;
    }
    for (int i = 0; i < HELD; i++)
        if (held[i] != NULL) w->errors += reservoir_allocator_free(w->h, held[i]) != RESERVOIR_OK;
    return NULL;
}

static void threads(void) {
    ReservoirAllocator *h = NULL;
    OK(reservoir_allocator_create(RESERVOIR_BACKEND_SIM, 0, 0, "", &h));
    pthread_t t[THREADS];
    Worker w[THREADS];
    for (int i = 0; i < THREADS; i++) {
        w[i] = (Worker){.h = h, .seed = 17u * (unsigned)i + 1, .errors = 0};
        OK(reservoir_allocator_create_stream(h, &w[i].stream));
        CHECK(pthread_create(&t[i], NULL, work, &w[i]) == 0, "pthread_create");
    }
    for (int i = 0; i < THREADS; i++) {
        pthread_join(t[i], NULL);
        CHECK(w[i].errors == 0, "thread %d: %d failed calls", i, w[i].errors);
    }
    CHECK(stat(h, "allocated_bytes.all.current") == 0, "all freed");
    CHECK(stat(h, "allocation.all.allocated") == stat(h, "allocation.all.freed"),
          "every allocation freed");
    OK(reservoir_allocator_destroy(h));
}

static void bad_inputs(const char *dir) {
    ReservoirAllocator *h = NULL;
    OK(reservoir_allocator_create(RESERVOIR_BACKEND_SIM, 0, 1024 * MiB, NULL, &h));
    void *live = NULL, *p = NULL;
    OK(reservoir_allocator_alloc(h, 1 * MiB, 0, &live));
    Stats base;
    read_stats(h, &base);

    /* Null handle. */
    EXPECT_ERR(reservoir_allocator_alloc(NULL, 4096, 0, &p), RESERVOIR_ERR_NULL_HANDLE, "null");
    EXPECT_ERR(reservoir_allocator_free(NULL, live), RESERVOIR_ERR_NULL_HANDLE, "null");
    EXPECT_ERR(reservoir_allocator_destroy(NULL), RESERVOIR_ERR_NULL_HANDLE, "null");
    /* Foreign handle. */
    ReservoirAllocator *foreign = (ReservoirAllocator *)(uintptr_t)0x1000;
    EXPECT_ERR(reservoir_allocator_empty_cache(foreign), RESERVOIR_ERR_INVALID_HANDLE, "0x1000");
    same_stats(h, &base, "bad handles");

    /* Null, foreign, interior and double frees. */
    EXPECT_ERR(reservoir_allocator_free(h, NULL), RESERVOIR_ERR_INVALID_POINTER, "null");
    same_stats(h, &base, "free(NULL)");
    EXPECT_ERR(reservoir_allocator_free(h, (void *)(uintptr_t)0x1234), RESERVOIR_ERR_INVALID_POINTER,
               "0x1234");
    same_stats(h, &base, "foreign free");
    char want[64];
    void *interior = (char *)live + 256;
    snprintf(want, sizeof want, "%p", interior);
    EXPECT_ERR(reservoir_allocator_free(h, interior), RESERVOIR_ERR_INVALID_POINTER, want);
    same_stats(h, &base, "interior free");
    OK(reservoir_allocator_alloc(h, 8192, 0, &p));
    OK(reservoir_allocator_free(h, p));
    Stats after_pair;
    read_stats(h, &after_pair);
    snprintf(want, sizeof want, "%p", p);
    EXPECT_ERR(reservoir_allocator_free(h, p), RESERVOIR_ERR_INVALID_POINTER, want);
    same_stats(h, &after_pair, "double free");
    EXPECT_ERR(reservoir_allocator_record_stream(h, (void *)(uintptr_t)0x1234, 0),
               RESERVOIR_ERR_INVALID_POINTER, "0x1234");
    same_stats(h, &after_pair, "record_stream of a foreign pointer");

    /* Streams: ids come from reservoir_allocator_create_stream of the same
     * handle; any other value is refused by the call naming it (issue 29). */
    uint64_t mine = 0, theirs = 0;
    ReservoirAllocator *other = NULL;
    OK(reservoir_allocator_create(RESERVOIR_BACKEND_SIM, 0, 1024 * MiB, NULL, &other));
    OK(reservoir_allocator_create_stream(other, &theirs));
    /* A null out-pointer is refused before a stream is made. */
    EXPECT_ERR(reservoir_allocator_create_stream(h, NULL), RESERVOIR_ERR_INVALID_ARGUMENT,
               "out is null");
    OK(reservoir_allocator_create_stream(h, &mine));
    CHECK(mine != theirs, "two handles' first streams differ: %llu", (unsigned long long)mine);
    Stats with_stream;
    read_stats(h, &with_stream);
    p = (void *)1;
    EXPECT_ERR(reservoir_allocator_alloc(h, 16, 12345, &p), RESERVOIR_ERR_INVALID_ARGUMENT,
               "stream 12345 is not a stream of allocator");
    CHECK(p == NULL, "failed alloc writes null");
    EXPECT_ERR(reservoir_allocator_alloc(h, 16, UINT64_MAX, &p), RESERVOIR_ERR_INVALID_ARGUMENT,
               "stream 18446744073709551615");
    snprintf(want, sizeof want, "stream %llu", (unsigned long long)theirs);
    EXPECT_ERR(reservoir_allocator_alloc(h, 16, theirs, &p), RESERVOIR_ERR_INVALID_ARGUMENT, want);
    snprintf(want, sizeof want, "stream %llu", (unsigned long long)(mine + 1));
    EXPECT_ERR(reservoir_allocator_alloc(h, 16, mine + 1, &p), RESERVOIR_ERR_INVALID_ARGUMENT, want);
    EXPECT_ERR(reservoir_allocator_record_stream(h, live, 999), RESERVOIR_ERR_INVALID_ARGUMENT,
               "stream 999");
    EXPECT_ERR(reservoir_allocator_record_stream(h, live, theirs), RESERVOIR_ERR_INVALID_ARGUMENT,
               "not a stream of allocator");
    same_stats(h, &with_stream, "unknown streams");
    OK(reservoir_allocator_alloc(h, 16, mine, &p));
    OK(reservoir_allocator_record_stream(h, p, mine));
    OK(reservoir_allocator_free(h, p));
    OK(reservoir_allocator_alloc(other, 16, theirs, &p));
    OK(reservoir_allocator_free(other, p));
    OK(reservoir_allocator_empty_cache(h));
    OK(reservoir_allocator_destroy(other));
    /* A device holds at most 65,536 streams (the default one included). */
    uint64_t s = 0, made = 1;
    ReservoirStatus st = RESERVOIR_OK;
    OK(reservoir_allocator_create(RESERVOIR_BACKEND_SIM, 0, 0, NULL, &other));
    while (made <= 70000 && (st = reservoir_allocator_create_stream(other, &s)) == RESERVOIR_OK) made++;
    CHECK(made == 65536 && st == RESERVOIR_ERR_BACKEND, "%llu streams, then %s",
          (unsigned long long)made, reservoir_status_name(st));
    CHECK(strstr(reservoir_last_error(), "65536") != NULL, "%s", reservoir_last_error());
    OK(reservoir_allocator_destroy(other));
    read_stats(h, &after_pair);

    /* Sizes. */
    p = (void *)1;
    EXPECT_ERR(reservoir_allocator_alloc(h, 0, 0, &p), RESERVOIR_ERR_INVALID_ARGUMENT, "size 0");
    CHECK(p == NULL, "failed alloc writes null");
    same_stats(h, &after_pair, "size 0");
    EXPECT_ERR(reservoir_allocator_alloc(h, (uint64_t)1 << 63, 0, &p), RESERVOIR_ERR_INVALID_ARGUMENT,
               "9223372036854775808");
    same_stats(h, &after_pair, "size 2^63");
    /* Over 1 EB: PyTorch's "Tried to allocate more than 1EB memory", before any counter moves. */
    EXPECT_ERR(reservoir_allocator_alloc(h, (uint64_t)1 << 62, 0, &p), RESERVOIR_ERR_OUT_OF_MEMORY,
               "4611686018427387904");
    same_stats(h, &after_pair, "size 2^62");
    EXPECT_ERR(reservoir_allocator_alloc(h, 4096, 0, NULL), RESERVOIR_ERR_INVALID_ARGUMENT, "out");
    same_stats(h, &after_pair, "null out");

    /* Other arguments. */
    EXPECT_ERR(reservoir_allocator_set_memory_fraction(h, 1.5), RESERVOIR_ERR_INVALID_ARGUMENT, "1.5");
    EXPECT_ERR(reservoir_allocator_set_memory_fraction(h, NAN), RESERVOIR_ERR_INVALID_ARGUMENT, "NaN");
    int64_t v;
    EXPECT_ERR(reservoir_allocator_stat(h, "no.such.key", &v), RESERVOIR_ERR_INVALID_ARGUMENT,
               "no.such.key");
    char key[KEY_LEN];
    size_t len;
    EXPECT_ERR(reservoir_allocator_stat_at(h, 100000, key, sizeof key, &len, &v),
               RESERVOIR_ERR_INVALID_ARGUMENT, "100000");
    char path[4096];
    snprintf(path, sizeof path, "%s/no/such/dir/s.pickle", dir);
    EXPECT_ERR(reservoir_allocator_snapshot(h, path), RESERVOIR_ERR_IO, "no/such/dir");
    same_stats(h, &after_pair, "bad arguments");

    /* Creation. */
    ReservoirAllocator *bad = (ReservoirAllocator *)1;
    EXPECT_ERR(reservoir_allocator_create(RESERVOIR_BACKEND_SIM, 0, 0, "max_split_size_mb:lots", &bad),
               RESERVOIR_ERR_INVALID_CONFIG, "lots");
    CHECK(bad == NULL, "failed create writes null");
    EXPECT_ERR(reservoir_allocator_create(RESERVOIR_BACKEND_SIM, 0, 0, "no_such_key:1", &bad),
               RESERVOIR_ERR_INVALID_CONFIG, "no_such_key");
    EXPECT_ERR(reservoir_allocator_create(RESERVOIR_BACKEND_SIM, 0, 0, "policy:frugal", &bad),
               RESERVOIR_ERR_INVALID_CONFIG, "frugal");
    CHECK(bad == NULL, "failed create writes null");
    /* A config string is at most 64 KiB (issue 29: 64 MiB of '[' took 4.3 GB),
     * and a message quotes a window of a long one, not the whole string. */
    size_t big = (size_t)64 << 20;
    char *huge = malloc(big + 1);
    CHECK(huge != NULL, "malloc");
    if (huge != NULL) {
        memset(huge, '[', big);
        huge[big] = '\0';
        EXPECT_ERR(reservoir_allocator_create(RESERVOIR_BACKEND_SIM, 0, 0, huge, &bad),
                   RESERVOIR_ERR_INVALID_CONFIG, "67108864 bytes, over the limit of 65536");
        CHECK(strlen(reservoir_last_error()) < 400, "message of %zu bytes", strlen(reservoir_last_error()));
        memset(huge, 'k', 60000);
        strcpy(huge + 60000, ":1");
        EXPECT_ERR(reservoir_allocator_create(RESERVOIR_BACKEND_SIM, 0, 0, huge, &bad),
                   RESERVOIR_ERR_INVALID_CONFIG, "unknown allocator setting `kkkk");
        CHECK(strlen(reservoir_last_error()) < 1000, "message of %zu bytes", strlen(reservoir_last_error()));
        free(huge);
    }
    CHECK(bad == NULL, "failed create writes null");
    /* Reservoir's own policies are named in the same string. */
    ReservoirAllocator *frugal = NULL;
    OK(reservoir_allocator_create(RESERVOIR_BACKEND_SIM, 0, 1024 * MiB, "max_split_size_mb:64,policy:reservoir",
                                  &frugal));
    OK(reservoir_allocator_alloc(frugal, 3 * MiB, 0, &p));
    OK(reservoir_allocator_free(frugal, p));
    OK(reservoir_allocator_destroy(frugal));
    EXPECT_ERR(reservoir_allocator_create(7, 0, 0, NULL, &bad), RESERVOIR_ERR_INVALID_ARGUMENT,
               "backend 7");
    EXPECT_ERR(reservoir_allocator_create(RESERVOIR_BACKEND_SIM, 300, 0, NULL, &bad),
               RESERVOIR_ERR_INVALID_ARGUMENT, "device 300");
    ReservoirStatus cuda = reservoir_allocator_create(RESERVOIR_BACKEND_CUDA, 0, 0, NULL, &bad);
    if (cuda == RESERVOIR_OK) {
        printf("capi-c: a CUDA driver loads\n");
        OK(reservoir_allocator_destroy(bad));
    } else {
        CHECK(cuda == RESERVOIR_ERR_BACKEND_UNAVAILABLE, "CUDA without a driver: %s: %s",
              reservoir_status_name(cuda), reservoir_last_error());
        CHECK(strstr(reservoir_last_error(), "CUDA device 0") != NULL, "%s", reservoir_last_error());
        printf("capi-c: no CUDA driver: %s\n", reservoir_last_error());
    }

    /* Use after destroy. */
    ReservoirAllocator *gone = NULL;
    OK(reservoir_allocator_create(RESERVOIR_BACKEND_SIM, 0, 0, NULL, &gone));
    OK(reservoir_allocator_destroy(gone));
    EXPECT_ERR(reservoir_allocator_alloc(gone, 4096, 0, &p), RESERVOIR_ERR_INVALID_HANDLE, "destroyed");
    EXPECT_ERR(reservoir_allocator_destroy(gone), RESERVOIR_ERR_INVALID_HANDLE, "destroyed");
    same_stats(h, &after_pair, "use after destroy");

    /* Status names, and the error cleared by a good call. */
    CHECK(strcmp(reservoir_status_name(RESERVOIR_ERR_POISONED), "RESERVOIR_ERR_POISONED") == 0, "name");
    CHECK(strcmp(reservoir_status_name(99), "RESERVOIR_UNKNOWN_STATUS") == 0, "unknown name");
    OK(reservoir_allocator_free(h, live));
    CHECK(reservoir_last_error()[0] == '\0', "last error cleared: %s", reservoir_last_error());
    CHECK(stat(h, "allocated_bytes.all.current") == 0, "the live block survived every bad call");
    OK(reservoir_allocator_destroy(h));
}

/* reservoir_last_error's text stays readable whatever is called next (issue
 * 29): a success leaves it as it was, a later error overwrites it in place.
 * Under valgrind (tests/c_program.rs runs `test_capi DIR last-error` so when
 * valgrind is installed) a freed message would be an invalid read. */
static void last_error_lifetime(void) {
    ReservoirAllocator *h = NULL;
    OK(reservoir_allocator_create(RESERVOIR_BACKEND_SIM, 0, 1024 * MiB, NULL, &h));
    void *p = NULL;
    EXPECT_ERR(reservoir_allocator_alloc(h, 0, 0, &p), RESERVOIR_ERR_INVALID_ARGUMENT, "size 0");
    const char *old = reservoir_last_error();
    char copy[256];
    snprintf(copy, sizeof copy, "%s", old);
    OK(reservoir_allocator_alloc(h, 4096, 0, &p));
    CHECK(reservoir_last_error()[0] == '\0', "no error after a success: %s", reservoir_last_error());
    CHECK(strcmp(old, copy) == 0, "the message read after a success: \"%s\", was \"%s\"", old, copy);
    OK(reservoir_allocator_free(h, p));
    CHECK(strcmp(old, copy) == 0, "the message read after two successes: \"%s\"", old);
    /* The printf("%s", ..., reservoir_last_error()) with the failing
     * call evaluated after it: the old pointer now reads the new message. */
    EXPECT_ERR(reservoir_allocator_alloc(h, 0, 0, &p), RESERVOIR_ERR_INVALID_ARGUMENT, "size 0");
    const char *before = reservoir_last_error();
    ReservoirStatus st = reservoir_allocator_free(h, (void *)(uintptr_t)0x1234);
    CHECK(st == RESERVOIR_ERR_INVALID_POINTER, "%s", reservoir_status_name(st));
    CHECK(strstr(before, "0x1234") != NULL, "the old pointer reads the new message: %s", before);
    CHECK(before == reservoir_last_error(), "one buffer per thread: %p %p", (const void *)before,
          (const void *)reservoir_last_error());
    /* A pointer taken from the static "" after a success stays "" too. */
    OK(reservoir_allocator_empty_cache(h));
    const char *empty = reservoir_last_error();
    /* The issue's own line: whichever argument C evaluates first, both
     * strings are live memory. */
    char line[512];
    snprintf(line, sizeof line, "%p %s", reservoir_alloc(-1, 0, NULL), reservoir_last_error());
    CHECK(strstr(reservoir_last_error(), "size -1 is negative") != NULL, "%s", reservoir_last_error());
    CHECK(empty[0] == '\0', "the empty string stays empty: %s", empty);
    OK(reservoir_allocator_destroy(h));
    CHECK(strstr(before, "size -1 is negative") != NULL, "after destroy: %s", before);
}

int main(int argc, char **argv) {
    const char *dir = argc > 1 ? argv[1] : ".";
    if (argc > 2 && strcmp(argv[2], "last-error") == 0) {
        last_error_lifetime();
        printf("capi-c: %d checks, %d failed\n", checks, failed);
        return failed != 0;
    }
    last_error_lifetime();
    normal_use(dir);
    host_memory();
    threads();
    bad_inputs(dir);
    printf("capi-c: %d checks, %d failed\n", checks, failed);
    return failed != 0;
}
