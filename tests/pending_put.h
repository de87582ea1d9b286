// A put begun by hand, as a client begins one, for tests that then commit
// it, abandon it or let it lapse like a client that died.
#ifndef TESSERA_TESTS_PENDING_PUT_H_
#define TESSERA_TESTS_PENDING_PUT_H_

#include <cstdint>
#include <string>

#include "proto/coordinator.pb.h"

namespace tessera {

// CreateTensor of a pending int8 tensor `name` of `elements` elements, in
// one shard on rank 0.
inline v1::CreateTensorRequest PendingPutRequest(const std::string& name,
                                                 int64_t elements) {
  v1::CreateTensorRequest create;
  create.set_name(name);
  create.add_shape(elements);
  create.mutable_properties()->set_dtype(v1::INT8);
  create.mutable_spec()->mutable_chunk()->set_dim(0);
  create.mutable_spec()->mutable_chunk()->add_placements()->set_rank(0);
  create.set_pending(true);
  return create;
}

}  // namespace tessera

#endif  // TESSERA_TESTS_PENDING_PUT_H_
