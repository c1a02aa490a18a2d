// A pool of worker threads that wait for work spinning, for the few-rows
// kernel's products: a decode call makes about 55 of them, microseconds
// apart, and a worker that slept between them would cost a wake-up each.
//
// One caller at a time runs a job: its share on the calling thread, and one
// on each worker that joins before the caller's share is done (each share
// takes pieces of the job until none is left). Workers spin for kSpinMicros
// after a job, then sleep on a condition variable until the next. The caller
// waits only for the workers that joined: a worker asleep, or one the OS has
// not yet run (XLA's own pool threads spin on the same cores after its
// parallel ops), would otherwise hold up the job until it runs. In a
// jax.profiler trace of the demo pair on a 2-core Zen 5 EPYC (two sentences
// through each decoder), when the caller waited for every worker, the
// target's first product after the encoder took 2.9 ms instead of 0.02, and
// the first product of the verification call 2.4-6.3 ms in 4 of 10
// iterations; waiting only for the workers that joined, one product in the
// same trace took over 0.4 ms. The demo then ran at 1.43-1.55x (median
// 1.51x) against 1.38-1.47x (median 1.43x), five runs of each in turn.
//
// (OpenMP's threads also spin, but inside XLA's executor its products of
// several rows ran at about half the speed they reach outside it. On a 2-core
// Zen 4 EPYC the demo target's 5-token call took 7.9-8.1 ms in the demo's
// runs with OpenMP and 5.5-5.7 ms with workers of the kernel's own, the runs
// alternating.)

#ifndef SPEC_DECODE_KERNELS_SPIN_POOL_H_
#define SPEC_DECODE_KERNELS_SPIN_POOL_H_

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <mutex>
#include <thread>

#include <pthread.h>
#include <sched.h>

namespace spin_pool {

// How long an idle worker spins before it sleeps.
constexpr int64_t kSpinMicros = 2000;
// Threads in all, the caller's included: the products are memory-bound, and
// a few cores' worth of streams fill the memory bus.
constexpr int kMaxThreads = 8;

inline void Relax() {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#elif defined(__aarch64__)
  asm volatile("yield");
#endif
}

// The CPUs this process may run on, at most kMaxThreads.
inline int NumThreads() {
  cpu_set_t set;
  int n = sched_getaffinity(0, sizeof(set), &set) == 0
              ? CPU_COUNT(&set)
              : static_cast<int>(std::thread::hardware_concurrency());
  return n < 1 ? 1 : (n > kMaxThreads ? kMaxThreads : n);
}

class Pool {
 public:
  // Takes its share of a job: callable at once from several threads, it
  // must hand out the job's pieces itself (an atomic counter) and return
  // when none is left.
  using Work = void (*)(const void* job);

  explicit Pool(int threads) : threads_(threads) {
    for (int i = 1; i < threads_; ++i) std::thread([this] { Serve(); }).detach();
  }

  // Runs work(job) here and on every worker that joins the job before this
  // thread's share is done, and returns once they have returned. A worker
  // not yet running (asleep, or descheduled while XLA's own pool threads
  // spin on these cores) is never waited for: the work is then done here.
  // If another thread is running a job, runs the work here alone.
  void Run(Work work, const void* job) {
    std::unique_lock<std::mutex> busy(busy_, std::try_to_lock);
    if (!busy.owns_lock() || threads_ == 1) {
      work(job);
      return;
    }
    work_ = work;
    job_ = job;
    // seq_cst, with the workers' count of sleepers: either this sees a
    // worker going to sleep and wakes it, or that worker sees the new job.
    const uint64_t open =
        (ticket_.load(std::memory_order_relaxed) & kGenerations) + kOneGeneration;
    ticket_.store(open, std::memory_order_seq_cst);
    if (sleepers_.load(std::memory_order_seq_cst) > 0) {
      std::lock_guard<std::mutex> lock(sleep_);
      wake_.notify_all();
    }
    work(job);
    // Closed: no worker joins from here on; wait for those that did.
    ticket_.fetch_or(kClosed, std::memory_order_acq_rel);
    while ((ticket_.load(std::memory_order_acquire) & kJoined) != 0) Relax();
  }

 private:
  // ticket_: the job's generation (high 32 bits), whether it is closed, and
  // how many workers have joined it and not yet returned.
  static constexpr uint64_t kOneGeneration = uint64_t{1} << 32;
  static constexpr uint64_t kGenerations = ~(kOneGeneration - 1);
  static constexpr uint64_t kClosed = uint64_t{1} << 31;
  static constexpr uint64_t kJoined = kClosed - 1;

  // Waits for a generation after `seen`: spinning, then asleep. The spin
  // yields the core every 64 pauses (a few microseconds), so that a thread
  // with work (XLA's executor, which makes the calls, or its pool's) is not
  // preempted for a scheduler slice of milliseconds while a worker idles on
  // the other core: in a profile of the demo pair, single XLA ops and
  // products of the verification call took about 2 ms instead of 0.02-0.2.
  // The demo ran at 1.56-1.58x with the yield against 1.43-1.53x without,
  // three runs of each in turn (2-core Zen 5 EPYC).
  uint64_t Next(uint64_t seen) {
    const auto start = std::chrono::steady_clock::now();
    for (int64_t spins = 0;; ++spins) {
      const uint64_t ticket = ticket_.load(std::memory_order_seq_cst);
      if ((ticket & kGenerations) != seen) return ticket;
      Relax();
      if (spins % 64 == 63) sched_yield();
      if (spins % 256 == 255 && std::chrono::steady_clock::now() - start >
                                    std::chrono::microseconds(kSpinMicros)) {
        std::unique_lock<std::mutex> lock(sleep_);
        sleepers_.fetch_add(1, std::memory_order_seq_cst);
        wake_.wait(lock, [&] {
          return (ticket_.load(std::memory_order_seq_cst) & kGenerations) !=
                 seen;
        });
        sleepers_.fetch_sub(1, std::memory_order_seq_cst);
        return ticket_.load(std::memory_order_seq_cst);
      }
    }
  }

  void Serve() {
    uint64_t seen = 0;
    for (;;) {
      uint64_t ticket = Next(seen);
      seen = ticket & kGenerations;
      // Join the job unless it is closed (or a newer one has replaced it,
      // which the next Next() call sees).
      while ((ticket & kClosed) == 0 && (ticket & kGenerations) == seen &&
             !ticket_.compare_exchange_weak(ticket, ticket + 1,
                                            std::memory_order_acq_rel)) {
        Relax();
      }
      if ((ticket & kClosed) != 0 || (ticket & kGenerations) != seen) continue;
      work_(job_);
      ticket_.fetch_sub(1, std::memory_order_acq_rel);
    }
  }

  const int threads_;
  Work work_ = nullptr;
  const void* job_ = nullptr;
  std::atomic<uint64_t> ticket_{0};
  std::atomic<int> sleepers_{0};
  std::mutex busy_, sleep_;
  std::condition_variable wake_;
};

// The process's pool, made on first use; a forked child makes its own (the
// parent's workers do not exist in it).
inline Pool& Shared() {
  static std::atomic<Pool*> pool{nullptr};
  static std::mutex made;
  static bool registered = [] {
    pthread_atfork(nullptr, nullptr, [] { pool.store(nullptr); });
    return true;
  }();
  (void)registered;
  Pool* p = pool.load(std::memory_order_acquire);
  if (p == nullptr) {
    std::lock_guard<std::mutex> lock(made);
    p = pool.load(std::memory_order_relaxed);
    if (p == nullptr) {
      p = new Pool(NumThreads());
      pool.store(p, std::memory_order_release);
    }
  }
  return *p;
}

}  // namespace spin_pool

#endif  // SPEC_DECODE_KERNELS_SPIN_POOL_H_
