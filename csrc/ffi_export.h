// FLASHINFER_EXPORT_FUNC(name, Function): exports a typed function under tvm-ffi's C ABI
// (symbol __tvm_ffi_<name>, what tvm_ffi.load_module looks up), as
// TVM_FFI_DLL_EXPORT_TYPED_FUNC does, for binding TUs only.
//
// Why not tvm-ffi's macro: it force-inlines every argument's conversion, error message
// included, into one function, and the host compiler's optimizer is superlinear in that
// function's size. The prefill binding's 29-argument launch took 16 of the TU's 20 s at -O2
// (2-core machine, g++ 12). Here each argument converts through an out-of-line function, one
// instantiation per parameter type, so the exported function is a row of calls: the same TU
// compiles in under 5 s.
#pragma once

#include <tvm/ffi/function.h>

#include <cstdint>
#include <optional>
#include <type_traits>
#include <utility>

namespace flashinfer_binding {
namespace ffi_export {

// Argument `index` of `function`'s call as a T, or a TypeError naming both.
template <typename T>
[[gnu::noinline]] T Arg(const tvm::ffi::AnyView* args, int32_t index, const char* function) {
  std::optional<T> value = args[index].template try_cast<T>();
  if (!value.has_value()) {
    const TVMFFIAny given = args[index].CopyToTVMFFIAny();
    TVM_FFI_THROW(TypeError) << function << ": argument #" << index << " must be "
                             << tvm::ffi::details::Type2Str<T>::v() << ", got "
                             << tvm::ffi::TypeTraits<T>::GetMismatchTypeInfo(&given);
  }
  return *std::move(value);
}

[[gnu::noinline]] inline void CheckArgCount(int32_t given, int32_t expected, const char* function) {
  if (given != expected) {
    TVM_FFI_THROW(TypeError) << function << " takes " << expected << " arguments, got " << given;
  }
}

template <typename R, typename... A, std::size_t... I>
void CallUnpacked(R (*f)(A...), std::index_sequence<I...>, const tvm::ffi::AnyView* args,
                  tvm::ffi::Any* result, const char* function) {
  if constexpr (std::is_void_v<R>) {
    f(Arg<std::decay_t<A>>(args, static_cast<int32_t>(I), function)...);
  } else {
    *result = R(f(Arg<std::decay_t<A>>(args, static_cast<int32_t>(I), function)...));
  }
}

template <typename R, typename... A>
void Call(R (*f)(A...), const TVMFFIAny* args, int32_t num_args, TVMFFIAny* result,
          const char* function) {
  CheckArgCount(num_args, static_cast<int32_t>(sizeof...(A)), function);
  CallUnpacked(f, std::index_sequence_for<A...>{}, reinterpret_cast<const tvm::ffi::AnyView*>(args),
               reinterpret_cast<tvm::ffi::Any*>(result), function);
}

}  // namespace ffi_export
}  // namespace flashinfer_binding

#define FLASHINFER_EXPORT_FUNC(ExportName, Function)                                            \
  extern "C" {                                                                                  \
  TVM_FFI_DLL_EXPORT int __tvm_ffi_##ExportName(void*, const TVMFFIAny* args, int32_t num_args, \
                                                TVMFFIAny* result) {                            \
    TVM_FFI_SAFE_CALL_BEGIN();                                                                  \
    ::flashinfer_binding::ffi_export::Call(&Function, args, num_args, result, #ExportName);     \
    TVM_FFI_SAFE_CALL_END();                                                                    \
  }                                                                                             \
  }
