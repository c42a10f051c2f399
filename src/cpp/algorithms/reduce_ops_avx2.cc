// The AVX2 variant of the reduction kernels. Compiled with -mavx2 -mf16c (see
// src/cpp/CMakeLists.txt); reduce_ops.cc calls fillAvx2Kernels() only on a CPU that has both.
//
// float32/float64/float16/bfloat16/int32/int64 SUM, PRODUCT, MIN, MAX use the intrinsics
// below (8 float32 lanes per register; float16 and bfloat16 are widened to float32 lanes);
// tails go through a zeroed register-sized buffer on the stack. The other kernels are the
// portable ones of reduce_kernels.h, auto-vectorised for this instruction set.

#include <immintrin.h>

#include "algorithms/reduce_kernels.h"

namespace ringtree::algorithms {

namespace {

// Loads / stores the first n < V::kLanes elements through a buffer; memory past them is
// neither read nor written.
template <class V>
typename V::Reg loadThroughBuffer(const unsigned char* p, size_t n) {
  unsigned char buffer[V::kLanes * V::kElementBytes] = {};
  std::memcpy(buffer, p, n * V::kElementBytes);
  return V::load(buffer);
}

template <class V>
void storeThroughBuffer(unsigned char* p, typename V::Reg v, size_t n) {
  unsigned char buffer[V::kLanes * V::kElementBytes];
  V::store(buffer, v);
  std::memcpy(p, buffer, n * V::kElementBytes);
}

// MIN/MAX with NaN propagation (reduce_ops.h): vminps/vmaxps return the second operand when
// either is NaN or both are equal, which gives b's element; then a's NaNs are put back.
struct Float32Math {
  using Reg = __m256;
  static Reg add(Reg a, Reg b) { return _mm256_add_ps(a, b); }
  static Reg mul(Reg a, Reg b) { return _mm256_mul_ps(a, b); }
  static Reg min(Reg a, Reg b) {
    return _mm256_blendv_ps(_mm256_min_ps(a, b), a, _mm256_cmp_ps(a, a, _CMP_UNORD_Q));
  }
  static Reg max(Reg a, Reg b) {
    return _mm256_blendv_ps(_mm256_max_ps(a, b), a, _mm256_cmp_ps(a, a, _CMP_UNORD_Q));
  }
};

struct Float32x8 : Float32Math {
  static constexpr size_t kLanes = 8;
  static constexpr size_t kElementBytes = 4;
  static Reg load(const unsigned char* p) { return _mm256_loadu_ps(reinterpret_cast<const float*>(p)); }
  static void store(unsigned char* p, Reg v) { _mm256_storeu_ps(reinterpret_cast<float*>(p), v); }
  static Reg loadPartial(const unsigned char* p, size_t n) { return loadThroughBuffer<Float32x8>(p, n); }
  static void storePartial(unsigned char* p, Reg v, size_t n) { storeThroughBuffer<Float32x8>(p, v, n); }
};

struct Float16x8 : Float32Math {
  static constexpr size_t kLanes = 8;
  static constexpr size_t kElementBytes = 2;
  static Reg load(const unsigned char* p) {
    return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
  }
  static void store(unsigned char* p, Reg v) {
    _mm_storeu_si128(reinterpret_cast<__m128i*>(p), _mm256_cvtps_ph(v, _MM_FROUND_TO_NEAREST_INT));
  }
  static Reg loadPartial(const unsigned char* p, size_t n) { return loadThroughBuffer<Float16x8>(p, n); }
  static void storePartial(unsigned char* p, Reg v, size_t n) { storeThroughBuffer<Float16x8>(p, v, n); }
};

// 16 bfloat16 lanes per step, as two float32 registers: vpunpck{l,h}wd with zero puts each
// element in the high half of a 32-bit lane, and vpackusdw after rounding puts them back;
// both work within 128-bit lanes, so the order of elements in between is permuted alike
// in every operand and undone on the way out.
struct BFloat16x16 {
  struct Reg {
    __m256 low;
    __m256 high;
  };
  static constexpr size_t kLanes = 16;
  static constexpr size_t kElementBytes = 2;
  static Reg widen(__m256i v) {
    const __m256i zero = _mm256_setzero_si256();
    return {_mm256_castsi256_ps(_mm256_unpacklo_epi16(zero, v)),
            _mm256_castsi256_ps(_mm256_unpackhi_epi16(zero, v))};
  }
  // Rounds as floatToBFloat16() does, leaving each result in the low half of its lane.
  static __m256i round(__m256 v) {
    const __m256i bits = _mm256_castps_si256(v);
    const __m256i high = _mm256_srli_epi32(bits, 16);
    const __m256i odd = _mm256_and_si256(high, _mm256_set1_epi32(1));
    const __m256i rounded = _mm256_srli_epi32(
        _mm256_add_epi32(_mm256_add_epi32(bits, _mm256_set1_epi32(0x7FFF)), odd), 16);
    const __m256i quietNan = _mm256_or_si256(high, _mm256_set1_epi32(0x40));
    const __m256i isNan = _mm256_castps_si256(_mm256_cmp_ps(v, v, _CMP_UNORD_Q));
    return _mm256_blendv_epi8(rounded, quietNan, isNan);
  }
  static Reg load(const unsigned char* p) {
    return widen(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
  }
  // No saturation in vpackusdw: every lane is <= 0xFFFF.
  static void store(unsigned char* p, Reg v) {
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(p), _mm256_packus_epi32(round(v.low), round(v.high)));
  }
  static Reg loadPartial(const unsigned char* p, size_t n) { return loadThroughBuffer<BFloat16x16>(p, n); }
  static void storePartial(unsigned char* p, Reg v, size_t n) { storeThroughBuffer<BFloat16x16>(p, v, n); }
  static Reg add(Reg a, Reg b) { return {Float32Math::add(a.low, b.low), Float32Math::add(a.high, b.high)}; }
  static Reg mul(Reg a, Reg b) { return {Float32Math::mul(a.low, b.low), Float32Math::mul(a.high, b.high)}; }
  static Reg min(Reg a, Reg b) { return {Float32Math::min(a.low, b.low), Float32Math::min(a.high, b.high)}; }
  static Reg max(Reg a, Reg b) { return {Float32Math::max(a.low, b.low), Float32Math::max(a.high, b.high)}; }
};

struct Float64x4 {
  using Reg = __m256d;
  static constexpr size_t kLanes = 4;
  static constexpr size_t kElementBytes = 8;
  static Reg load(const unsigned char* p) { return _mm256_loadu_pd(reinterpret_cast<const double*>(p)); }
  static void store(unsigned char* p, Reg v) { _mm256_storeu_pd(reinterpret_cast<double*>(p), v); }
  static Reg loadPartial(const unsigned char* p, size_t n) { return loadThroughBuffer<Float64x4>(p, n); }
  static void storePartial(unsigned char* p, Reg v, size_t n) { storeThroughBuffer<Float64x4>(p, v, n); }
  static Reg add(Reg a, Reg b) { return _mm256_add_pd(a, b); }
  static Reg mul(Reg a, Reg b) { return _mm256_mul_pd(a, b); }
  static Reg min(Reg a, Reg b) {
    return _mm256_blendv_pd(_mm256_min_pd(a, b), a, _mm256_cmp_pd(a, a, _CMP_UNORD_Q));
  }
  static Reg max(Reg a, Reg b) {
    return _mm256_blendv_pd(_mm256_max_pd(a, b), a, _mm256_cmp_pd(a, a, _CMP_UNORD_Q));
  }
};

struct Int32x8 {
  using Reg = __m256i;
  static constexpr size_t kLanes = 8;
  static constexpr size_t kElementBytes = 4;
  static Reg load(const unsigned char* p) { return _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)); }
  static void store(unsigned char* p, Reg v) { _mm256_storeu_si256(reinterpret_cast<__m256i*>(p), v); }
  static Reg loadPartial(const unsigned char* p, size_t n) { return loadThroughBuffer<Int32x8>(p, n); }
  static void storePartial(unsigned char* p, Reg v, size_t n) { storeThroughBuffer<Int32x8>(p, v, n); }
  static Reg add(Reg a, Reg b) { return _mm256_add_epi32(a, b); }
  static Reg mul(Reg a, Reg b) { return _mm256_mullo_epi32(a, b); }
  static Reg min(Reg a, Reg b) { return _mm256_min_epi32(a, b); }
  static Reg max(Reg a, Reg b) { return _mm256_max_epi32(a, b); }
};

// AVX2 has no 64-bit multiply, min or max: built from 32x32->64 multiplies and compares.
struct Int64x4 {
  using Reg = __m256i;
  static constexpr size_t kLanes = 4;
  static constexpr size_t kElementBytes = 8;
  static Reg load(const unsigned char* p) { return _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)); }
  static void store(unsigned char* p, Reg v) { _mm256_storeu_si256(reinterpret_cast<__m256i*>(p), v); }
  static Reg loadPartial(const unsigned char* p, size_t n) { return loadThroughBuffer<Int64x4>(p, n); }
  static void storePartial(unsigned char* p, Reg v, size_t n) { storeThroughBuffer<Int64x4>(p, v, n); }
  static Reg add(Reg a, Reg b) { return _mm256_add_epi64(a, b); }
  // Low 64 bits of a * b = lo(a)lo(b) + ((hi(a)lo(b) + lo(a)hi(b)) << 32).
  static Reg mul(Reg a, Reg b) {
    const __m256i low = _mm256_mul_epu32(a, b);
    const __m256i cross = _mm256_add_epi64(_mm256_mul_epu32(_mm256_srli_epi64(a, 32), b),
                                           _mm256_mul_epu32(a, _mm256_srli_epi64(b, 32)));
    return _mm256_add_epi64(low, _mm256_slli_epi64(cross, 32));
  }
  static Reg min(Reg a, Reg b) { return _mm256_blendv_epi8(a, b, _mm256_cmpgt_epi64(a, b)); }
  static Reg max(Reg a, Reg b) { return _mm256_blendv_epi8(a, b, _mm256_cmpgt_epi64(b, a)); }
};

}  // namespace

void fillAvx2Kernels(ReduceTable& table) {
  fillPortableKernels(table);
  setVectorArithmetic<Float16x8>(table, DataType::kFloat16);
  setVectorArithmetic<BFloat16x16>(table, DataType::kBFloat16);
  setVectorArithmetic<Float32x8>(table, DataType::kFloat32);
  setVectorArithmetic<Float64x4>(table, DataType::kFloat64);
  setVectorArithmetic<Int32x8>(table, DataType::kInt32);
  setVectorArithmetic<Int64x4>(table, DataType::kInt64);
  setKernel(table, DataType::kComplex64, ReduceOp::kSum,
            &complexSumKernel<&vectorKernel<Float32x8, ReduceOp::kSum>>);
  setKernel(table, DataType::kComplex128, ReduceOp::kSum,
            &complexSumKernel<&vectorKernel<Float64x4, ReduceOp::kSum>>);
}

}  // namespace ringtree::algorithms
