/*
 * A wall clock set off by a fixed offset, for one process: LD_PRELOAD this library and set
 * TOWER_REDLOCK_CLOCK_OFFSET_US (signed microseconds). The test kit starts a redis-server
 * with it to run a master whose clock is really skewed: `TIME`, `PX` expiries and the
 * scripts' clock reads all see it. Monotonic clocks are left alone (an offset changes no
 * duration).
 *
 * Why not libfaketime: Debian's libfaketime 0.9.10 recurses at start-up inside Debian's
 * redis-server (jemalloc's first malloc reads the clock; libfaketime's initialisation then
 * looks up `__ftime`, which glibc 2.36 no longer has, and the failed lookup mallocs again).
 * This library needs no initialisation: it reads the clock with the system call itself.
 */
#define _GNU_SOURCE
#include <stdlib.h>
#include <sys/syscall.h>
#include <sys/time.h>
#include <time.h>
#include <unistd.h>

static long long offset_us(void) {
    static long long cached;
    static int known;
    if (!known) {
        const char *s = getenv("TOWER_REDLOCK_CLOCK_OFFSET_US");
        cached = s ? strtoll(s, NULL, 10) : 0;
        known = 1;
    }
    return cached;
}

static int realtime(clockid_t clk) {
    return clk == CLOCK_REALTIME || clk == CLOCK_REALTIME_COARSE;
}

static void shift(struct timespec *ts) {
    long long ns = (long long)ts->tv_sec * 1000000000LL + ts->tv_nsec + offset_us() * 1000LL;
    ts->tv_sec = ns / 1000000000LL;
    ts->tv_nsec = ns % 1000000000LL;
    if (ts->tv_nsec < 0) {
        ts->tv_nsec += 1000000000LL;
        ts->tv_sec -= 1;
    }
}

int clock_gettime(clockid_t clk, struct timespec *ts) {
    int r = (int)syscall(SYS_clock_gettime, clk, ts);
    if (r == 0 && realtime(clk)) {
        shift(ts);
    }
    return r;
}

int gettimeofday(struct timeval *tv, void *tz) {
    struct timespec ts;
    int r = clock_gettime(CLOCK_REALTIME, &ts);
    (void)tz;
    if (r == 0 && tv) {
        tv->tv_sec = ts.tv_sec;
        tv->tv_usec = ts.tv_nsec / 1000;
    }
    return r;
}

time_t time(time_t *out) {
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    if (out) {
        *out = ts.tv_sec;
    }
    return ts.tv_sec;
}
