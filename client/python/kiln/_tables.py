"""Correspondence between torch's enum-like values and the kiln.v1 enums (both directions)."""

import torch

from kiln import proto

_DTYPE_NAMES = {
    "float32": proto.DTYPE_FLOAT32, "float64": proto.DTYPE_FLOAT64,
    "float16": proto.DTYPE_FLOAT16, "bfloat16": proto.DTYPE_BFLOAT16,
    "int8": proto.DTYPE_INT8, "int16": proto.DTYPE_INT16, "int32": proto.DTYPE_INT32,
    "int64": proto.DTYPE_INT64, "uint8": proto.DTYPE_UINT8, "bool": proto.DTYPE_BOOL,
    "complex64": proto.DTYPE_COMPLEX64, "complex128": proto.DTYPE_COMPLEX128,
    "float8_e4m3fn": proto.DTYPE_FLOAT8_E4M3FN, "float8_e5m2": proto.DTYPE_FLOAT8_E5M2,
    "uint16": proto.DTYPE_UINT16, "uint32": proto.DTYPE_UINT32, "uint64": proto.DTYPE_UINT64,
}
# getattr: a dtype this torch does not have simply cannot occur.
DTYPE_TO_PB = {getattr(torch, n): v for n, v in _DTYPE_NAMES.items() if hasattr(torch, n)}
PB_TO_DTYPE = {v: k for k, v in DTYPE_TO_PB.items()}

DEVICE_TO_PB = {"cpu": proto.DEVICE_KIND_CPU, "cuda": proto.DEVICE_KIND_CUDA,
                "meta": proto.DEVICE_KIND_META}
PB_TO_DEVICE = {v: k for k, v in DEVICE_TO_PB.items()}

LAYOUT_TO_PB = {torch.strided: proto.LAYOUT_STRIDED, torch.sparse_coo: proto.LAYOUT_SPARSE_COO,
                torch.sparse_csr: proto.LAYOUT_SPARSE_CSR, torch._mkldnn: proto.LAYOUT_MKLDNN}
PB_TO_LAYOUT = {v: k for k, v in LAYOUT_TO_PB.items()}

MEMORY_FORMAT_TO_PB = {
    torch.contiguous_format: proto.MEMORY_FORMAT_CONTIGUOUS,
    torch.channels_last: proto.MEMORY_FORMAT_CHANNELS_LAST,
    torch.channels_last_3d: proto.MEMORY_FORMAT_CHANNELS_LAST_3D,
    torch.preserve_format: proto.MEMORY_FORMAT_PRESERVE,
}
PB_TO_MEMORY_FORMAT = {v: k for k, v in MEMORY_FORMAT_TO_PB.items()}
