// braid_torch._C: the creator torch.distributed calls for backend "braid".
#include <pybind11/chrono.h>
#include <torch/csrc/utils/pybind.h>

#include "process_group.h"

PYBIND11_MODULE(_C, m) {
  m.doc() = "braid's torch.distributed backend";
  // Blocks until every rank of the group has met: the GIL is released so
  // other Python threads run meanwhile.
  m.def("create_process_group", &braid::torch_backend::createProcessGroup, pybind11::arg("store"),
        pybind11::arg("rank"), pybind11::arg("size"), pybind11::arg("timeout"),
        pybind11::call_guard<pybind11::gil_scoped_release>());
  // torchft's reconfiguration (braid_torch.torchft): a group grows by new
  // processes, which join it through the store.
  m.def(
      "grow",
      [](const c10::intrusive_ptr<c10d::Backend>& backend,
         const c10::intrusive_ptr<c10d::Store>& store, int size) {
        auto* group = dynamic_cast<braid::torch_backend::ProcessGroupBraid*>(backend.get());
        if (!group)
          throw std::invalid_argument("braid_torch grow: the backend is " +
                                      backend->getBackendName() + "'s, not braid's");
        return group->grow(store, size);
      },
      pybind11::arg("backend"), pybind11::arg("store"), pybind11::arg("size"),
      pybind11::call_guard<pybind11::gil_scoped_release>());
  m.def("join_grown", &braid::torch_backend::joinGrown, pybind11::arg("store"),
        pybind11::arg("rank"), pybind11::arg("size"), pybind11::arg("timeout"),
        pybind11::call_guard<pybind11::gil_scoped_release>());
  m.attr("TORCH_VERSION_BUILT_WITH") = TORCH_VERSION;
  // Whether calls take CUDA tensors (cuda_work.h).
#if BRAID_TORCH_CUDA
  m.attr("HAS_CUDA") = true;
#else
  m.attr("HAS_CUDA") = false;
#endif
}
