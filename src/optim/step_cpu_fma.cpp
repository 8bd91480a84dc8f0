// The optimizer's host loops (step_loops.inc) for x86-64-v3: the Makefile compiles this file with
// -march=x86-64-v3 -ffp-contract=off. step_cpu.cpp calls them where the CPU has AVX2 and FMA.
#define GPT_STEP_ISA fma
#include "optim/step_loops.inc"
