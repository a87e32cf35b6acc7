// A spinning thread's pause: lets the core's other hardware thread run and
// saves power while a wait spins briefly before it sleeps.
#pragma once

namespace braid {

inline void cpuRelax() {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#elif defined(__aarch64__)
  asm volatile("yield");
#endif
}

}  // namespace braid
