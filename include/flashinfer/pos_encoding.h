// Position encodings applied inside the attention kernels (the reference's pos_encoding_mode),
// one module build each. Plain C++: the host-compiled bindings name their build by it too.
//
// kRopeLlama: queries and keys rotated (attention_rope.cuh). kAlibi: each score gains
// slope[qo_head] * (kv_idx - qo_idx) before the softmax (natural-log units), kv_idx the key's
// index in its request and qo_idx the query's (0 for a decode query), as the reference adds
// it, so LSEs agree with the reference's too. The kernels take the slopes times log2(e), in the
// log2 units their scores are in.
#pragma once

namespace flashinfer {

enum class PosEncoding : int { kNone = 0, kRopeLlama = 1, kAlibi = 2 };

}  // namespace flashinfer
