// The AVX-512 variant of the reduction kernels. Compiled with
// -mavx512f -mavx512bw -mavx512vl -mavx512dq -mavx2 -mf16c (see src/cpp/CMakeLists.txt);
// reduce_ops.cc calls fillAvx512Kernels() only on a CPU that has all of them.
//
// float32/float64/float16/bfloat16/int32/int64 SUM, PRODUCT, MIN, MAX use the intrinsics
// below (16 float32 lanes per register; float16 and bfloat16 are widened to float32 lanes);
// tails use masked loads and stores. The other kernels are the portable ones of
// reduce_kernels.h, auto-vectorised for this instruction set.

// GCC 12's AVX-512 headers trip -Wmaybe-uninitialized on their own _mm512_undefined_*()
// placeholders (GCC bug 105593, fixed in GCC 13): silence it for the header only.
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif
#include <immintrin.h>
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic pop
#endif

#include "algorithms/reduce_kernels.h"

namespace ringtree::algorithms {

namespace {

inline __mmask16 firstLanes16(size_t n) { return static_cast<__mmask16>((1u << n) - 1u); }
inline __mmask32 firstLanes32(size_t n) { return static_cast<__mmask32>((uint64_t{1} << n) - 1u); }
inline __mmask8 firstLanes8(size_t n) { return static_cast<__mmask8>((1u << n) - 1u); }

// MIN/MAX with NaN propagation (reduce_ops.h): vminps/vmaxps return the second operand when
// either is NaN or both are equal, which gives b's element; then a's NaNs are put back.
struct Float32Math {
  using Reg = __m512;
  static Reg add(Reg a, Reg b) { return _mm512_add_ps(a, b); }
  static Reg mul(Reg a, Reg b) { return _mm512_mul_ps(a, b); }
  static Reg min(Reg a, Reg b) {
    return _mm512_mask_mov_ps(_mm512_min_ps(a, b), _mm512_cmp_ps_mask(a, a, _CMP_UNORD_Q), a);
  }
  static Reg max(Reg a, Reg b) {
    return _mm512_mask_mov_ps(_mm512_max_ps(a, b), _mm512_cmp_ps_mask(a, a, _CMP_UNORD_Q), a);
  }
};

struct Float32x16 : Float32Math {
  static constexpr size_t kLanes = 16;
  static constexpr size_t kElementBytes = 4;
  static Reg load(const unsigned char* p) { return _mm512_loadu_ps(p); }
  static void store(unsigned char* p, Reg v) { _mm512_storeu_ps(p, v); }
  static Reg loadPartial(const unsigned char* p, size_t n) {
    return _mm512_maskz_loadu_ps(firstLanes16(n), p);
  }
  static void storePartial(unsigned char* p, Reg v, size_t n) {
    _mm512_mask_storeu_ps(p, firstLanes16(n), v);
  }
};

struct Float16x16 : Float32Math {
  static constexpr size_t kLanes = 16;
  static constexpr size_t kElementBytes = 2;
  static Reg load(const unsigned char* p) {
    return _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
  }
  static void store(unsigned char* p, Reg v) {
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(p), _mm512_cvtps_ph(v, _MM_FROUND_TO_NEAREST_INT));
  }
  static Reg loadPartial(const unsigned char* p, size_t n) {
    return _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(firstLanes16(n), p));
  }
  static void storePartial(unsigned char* p, Reg v, size_t n) {
    _mm256_mask_storeu_epi16(p, firstLanes16(n), _mm512_cvtps_ph(v, _MM_FROUND_TO_NEAREST_INT));
  }
};

// 32 bfloat16 lanes per step, as two float32 registers: vpunpck{l,h}wd with zero puts
// each element in the high half of a 32-bit lane, and vpackusdw after rounding puts them
// back; both work within 128-bit lanes, so the order of elements in between is permuted
// alike in every operand and undone on the way out.
struct BFloat16x32 {
  struct Reg {
    __m512 low;
    __m512 high;
  };
  static constexpr size_t kLanes = 32;
  static constexpr size_t kElementBytes = 2;
  static Reg widen(__m512i v) {
    const __m512i zero = _mm512_setzero_si512();
    return {_mm512_castsi512_ps(_mm512_unpacklo_epi16(zero, v)),
            _mm512_castsi512_ps(_mm512_unpackhi_epi16(zero, v))};
  }
  // Rounds as floatToBFloat16() does, leaving each result in the low half of its lane.
  static __m512i round(__m512 v) {
    const __m512i bits = _mm512_castps_si512(v);
    const __m512i high = _mm512_srli_epi32(bits, 16);
    const __m512i odd = _mm512_and_si512(high, _mm512_set1_epi32(1));
    const __m512i rounded =
        _mm512_srli_epi32(_mm512_add_epi32(_mm512_add_epi32(bits, _mm512_set1_epi32(0x7FFF)), odd), 16);
    return _mm512_mask_or_epi32(rounded, _mm512_cmp_ps_mask(v, v, _CMP_UNORD_Q), high,
                                _mm512_set1_epi32(0x40));
  }
  static __m512i narrow(Reg v) { return _mm512_packus_epi32(round(v.low), round(v.high)); }
  static Reg load(const unsigned char* p) { return widen(_mm512_loadu_si512(p)); }
  static void store(unsigned char* p, Reg v) { _mm512_storeu_si512(p, narrow(v)); }
  static Reg loadPartial(const unsigned char* p, size_t n) {
    return widen(_mm512_maskz_loadu_epi16(firstLanes32(n), p));
  }
  static void storePartial(unsigned char* p, Reg v, size_t n) {
    _mm512_mask_storeu_epi16(p, firstLanes32(n), narrow(v));
  }
  static Reg add(Reg a, Reg b) { return {Float32Math::add(a.low, b.low), Float32Math::add(a.high, b.high)}; }
  static Reg mul(Reg a, Reg b) { return {Float32Math::mul(a.low, b.low), Float32Math::mul(a.high, b.high)}; }
  static Reg min(Reg a, Reg b) { return {Float32Math::min(a.low, b.low), Float32Math::min(a.high, b.high)}; }
  static Reg max(Reg a, Reg b) { return {Float32Math::max(a.low, b.low), Float32Math::max(a.high, b.high)}; }
};

struct Float64x8 {
  using Reg = __m512d;
  static constexpr size_t kLanes = 8;
  static constexpr size_t kElementBytes = 8;
  static Reg load(const unsigned char* p) { return _mm512_loadu_pd(p); }
  static void store(unsigned char* p, Reg v) { _mm512_storeu_pd(p, v); }
  static Reg loadPartial(const unsigned char* p, size_t n) {
    return _mm512_maskz_loadu_pd(firstLanes8(n), p);
  }
  static void storePartial(unsigned char* p, Reg v, size_t n) {
    _mm512_mask_storeu_pd(p, firstLanes8(n), v);
  }
  static Reg add(Reg a, Reg b) { return _mm512_add_pd(a, b); }
  static Reg mul(Reg a, Reg b) { return _mm512_mul_pd(a, b); }
  static Reg min(Reg a, Reg b) {
    return _mm512_mask_mov_pd(_mm512_min_pd(a, b), _mm512_cmp_pd_mask(a, a, _CMP_UNORD_Q), a);
  }
  static Reg max(Reg a, Reg b) {
    return _mm512_mask_mov_pd(_mm512_max_pd(a, b), _mm512_cmp_pd_mask(a, a, _CMP_UNORD_Q), a);
  }
};

struct Int32x16 {
  using Reg = __m512i;
  static constexpr size_t kLanes = 16;
  static constexpr size_t kElementBytes = 4;
  static Reg load(const unsigned char* p) { return _mm512_loadu_si512(p); }
  static void store(unsigned char* p, Reg v) { _mm512_storeu_si512(p, v); }
  static Reg loadPartial(const unsigned char* p, size_t n) {
    return _mm512_maskz_loadu_epi32(firstLanes16(n), p);
  }
  static void storePartial(unsigned char* p, Reg v, size_t n) {
    _mm512_mask_storeu_epi32(p, firstLanes16(n), v);
  }
  static Reg add(Reg a, Reg b) { return _mm512_add_epi32(a, b); }
  static Reg mul(Reg a, Reg b) { return _mm512_mullo_epi32(a, b); }
  static Reg min(Reg a, Reg b) { return _mm512_min_epi32(a, b); }
  static Reg max(Reg a, Reg b) { return _mm512_max_epi32(a, b); }
};

struct Int64x8 {
  using Reg = __m512i;
  static constexpr size_t kLanes = 8;
  static constexpr size_t kElementBytes = 8;
  static Reg load(const unsigned char* p) { return _mm512_loadu_si512(p); }
  static void store(unsigned char* p, Reg v) { _mm512_storeu_si512(p, v); }
  static Reg loadPartial(const unsigned char* p, size_t n) {
    return _mm512_maskz_loadu_epi64(firstLanes8(n), p);
  }
  static void storePartial(unsigned char* p, Reg v, size_t n) {
    _mm512_mask_storeu_epi64(p, firstLanes8(n), v);
  }
  static Reg add(Reg a, Reg b) { return _mm512_add_epi64(a, b); }
  static Reg mul(Reg a, Reg b) { return _mm512_mullo_epi64(a, b); }
  static Reg min(Reg a, Reg b) { return _mm512_min_epi64(a, b); }
  static Reg max(Reg a, Reg b) { return _mm512_max_epi64(a, b); }
};

}  // namespace

void fillAvx512Kernels(ReduceTable& table) {
  fillPortableKernels(table);
  setVectorArithmetic<Float16x16>(table, DataType::kFloat16);
  setVectorArithmetic<BFloat16x32>(table, DataType::kBFloat16);
  setVectorArithmetic<Float32x16>(table, DataType::kFloat32);
  setVectorArithmetic<Float64x8>(table, DataType::kFloat64);
  setVectorArithmetic<Int32x16>(table, DataType::kInt32);
  setVectorArithmetic<Int64x8>(table, DataType::kInt64);
  setKernel(table, DataType::kComplex64, ReduceOp::kSum,
            &complexSumKernel<&vectorKernel<Float32x16, ReduceOp::kSum>>);
  setKernel(table, DataType::kComplex128, ReduceOp::kSum,
            &complexSumKernel<&vectorKernel<Float64x8, ReduceOp::kSum>>);
}

}  // namespace ringtree::algorithms
