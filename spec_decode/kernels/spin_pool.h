// A pool of worker threads that wait for work spinning, for the few-rows
// kernel's products: a decode call makes about 55 of them, microseconds
// apart, and a worker that slept between them would cost a wake-up each.
//
// One caller at a time runs a job split into parts: part 0 on the calling
// thread, part i on worker i. Workers spin for kSpinMicros after a job, then
// sleep on a condition variable until the next. (OpenMP's threads did the
// same, but inside XLA's executor its products of several rows ran at about
// half the speed they reach outside it. On a 2-core Zen 4 EPYC the demo
// target's 5-token call took 7.9-8.1 ms in the demo's runs with OpenMP and
// 5.5-5.7 ms with workers of the kernel's own, the runs alternating.)

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
  using Part = void (*)(const void* job, int part, int parts);

  explicit Pool(int threads) : parts_(threads) {
    for (int i = 1; i < parts_; ++i) std::thread([this, i] { Work(i); }).detach();
  }

  int parts() const { return parts_; }

  // Runs part(job, i, parts()) for every i, i = 0 here, and returns when all
  // are done. If another thread is running a job, runs every part here.
  void Run(Part part, const void* job) {
    std::unique_lock<std::mutex> busy(busy_, std::try_to_lock);
    if (!busy.owns_lock() || parts_ == 1) {
      for (int i = 0; i < parts_; ++i) part(job, i, parts_);
      return;
    }
    part_ = part;
    job_ = job;
    remaining_.store(parts_ - 1, std::memory_order_relaxed);
    // seq_cst, with the workers' count of sleepers: either this sees a
    // worker going to sleep and wakes it, or that worker sees the new job.
    generation_.fetch_add(1, std::memory_order_seq_cst);
    if (sleepers_.load(std::memory_order_seq_cst) > 0) {
      std::lock_guard<std::mutex> lock(sleep_);
      wake_.notify_all();
    }
    part(job, 0, parts_);
    while (remaining_.load(std::memory_order_acquire) != 0) Relax();
  }

 private:
  void Work(int index) {
    uint64_t seen = 0;
    for (;;) {
      const auto start = std::chrono::steady_clock::now();
      for (int64_t spins = 0;
           generation_.load(std::memory_order_seq_cst) == seen; ++spins) {
        Relax();
        if (spins % 256 == 255 &&
            std::chrono::steady_clock::now() - start >
                std::chrono::microseconds(kSpinMicros)) {
          std::unique_lock<std::mutex> lock(sleep_);
          sleepers_.fetch_add(1, std::memory_order_seq_cst);
          wake_.wait(lock, [&] {
            return generation_.load(std::memory_order_seq_cst) != seen;
          });
          sleepers_.fetch_sub(1, std::memory_order_seq_cst);
          break;
        }
      }
      seen = generation_.load(std::memory_order_seq_cst);
      part_(job_, index, parts_);
      remaining_.fetch_sub(1, std::memory_order_acq_rel);
    }
  }

  const int parts_;
  Part part_ = nullptr;
  const void* job_ = nullptr;
  std::atomic<uint64_t> generation_{0};
  std::atomic<int> remaining_{0};
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
