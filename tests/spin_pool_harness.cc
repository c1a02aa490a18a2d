// Drives spin_pool.h's Pool for tests/spin_pool_test.py; prints one line of
// counts, exits nonzero on a broken invariant.
//
//   stress: 200,000 jobs of 1-8 pieces each, on 3 threads. A job lives on
//     the caller's stack and is marked finished as Run returns: a worker that
//     touched it afterwards (one that joined late, or was not waited for)
//     counts as stale, and every piece must be done exactly once.
//   asleep: 20 jobs of one piece, each after the workers have gone to sleep
//     (10 ms idle, past kSpinMicros): prints how many ran on a worker.

#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <thread>

#include "spin_pool.h"

namespace {

struct Job {
  int pieces = 0;
  std::atomic<int> next{0};
  std::atomic<int> done{0};
  std::atomic<int> on_workers{0};
  std::atomic<bool> finished{false};
  std::thread::id caller;
};

std::atomic<long> stale{0};

void Share(const void* opaque) {
  Job& job = *const_cast<Job*>(static_cast<const Job*>(opaque));
  if (job.finished.load()) stale.fetch_add(1);
  if (std::this_thread::get_id() != job.caller) job.on_workers.fetch_add(1);
  for (int p = job.next.fetch_add(1); p < job.pieces; p = job.next.fetch_add(1)) {
    for (volatile int spin = 0; spin < 200; spin = spin + 1) {
    }
    job.done.fetch_add(1);
  }
  if (job.finished.load()) stale.fetch_add(1);
}

int Stress() {
  // Never destroyed, as the kernel's pool is not: its workers run on.
  auto& pool = *new spin_pool::Pool(3);
  long wrong = 0, joined = 0, jobs = 200000;
  for (long i = 0; i < jobs; ++i) {
    Job job;
    job.pieces = 1 + static_cast<int>(i % 8);
    job.caller = std::this_thread::get_id();
    pool.Run(Share, &job);
    job.finished.store(true);
    if (job.done.load() != job.pieces) ++wrong;
    joined += job.on_workers.load() > 0;
    // Other work on the stack where the job was: a late reader sees garbage.
    volatile char scribble[sizeof(Job)];
    std::memset(const_cast<char*>(scribble), 0xff, sizeof(scribble));
  }
  std::printf("jobs %ld wrong %ld stale %ld joined %ld\n", jobs, wrong,
              stale.load(), joined);
  return wrong == 0 && stale.load() == 0 ? 0 : 1;
}

int Asleep() {
  auto& pool = *new spin_pool::Pool(2);
  int on_workers = 0, jobs = 20;
  for (int i = 0; i < jobs; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
    Job job;
    job.pieces = 1;
    job.caller = std::this_thread::get_id();
    pool.Run(Share, &job);
    job.finished.store(true);
    if (job.done.load() != 1) return 1;
    on_workers += job.on_workers.load() > 0;
  }
  std::printf("jobs %d on_workers %d stale %ld\n", jobs, on_workers,
              stale.load());
  return stale.load() == 0 ? 0 : 1;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc == 2 && std::strcmp(argv[1], "stress") == 0) return Stress();
  if (argc == 2 && std::strcmp(argv[1], "asleep") == 0) return Asleep();
  std::fprintf(stderr, "usage: %s stress|asleep\n", argv[0]);
  return 2;
}
