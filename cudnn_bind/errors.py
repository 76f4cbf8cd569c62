"""Errors raised by cudnn_bind, and the status-code tables they are named from.

cuDNN renumbered its statuses in version 9 (0 success, then 1000s, 2000s, ...
grouped by category); version 8 numbered them 0-15.  Both tables are kept so
the name is right whichever library was loaded.
"""
from __future__ import annotations

__all__ = ["CudnnBindError", "CudnnError", "CudaError", "CudnnUnavailableError",
           "UnsupportedError", "status_name"]

# cuDNN 9 (cudnn_graph.h)
_STATUS_9 = {
    0: "CUDNN_STATUS_SUCCESS",
    1001: "CUDNN_STATUS_NOT_INITIALIZED",
    1002: "CUDNN_STATUS_SUBLIBRARY_VERSION_MISMATCH",
    1003: "CUDNN_STATUS_SERIALIZATION_VERSION_MISMATCH",
    1004: "CUDNN_STATUS_DEPRECATED",
    1005: "CUDNN_STATUS_LICENSE_ERROR",
    1006: "CUDNN_STATUS_RUNTIME_IN_PROGRESS",
    1007: "CUDNN_STATUS_RUNTIME_FP_OVERFLOW",
    1008: "CUDNN_STATUS_SUBLIBRARY_LOADING_FAILED",
    2000: "CUDNN_STATUS_BAD_PARAM",
    2002: "CUDNN_STATUS_BAD_PARAM_NULL_POINTER",
    2003: "CUDNN_STATUS_BAD_PARAM_MISALIGNED_POINTER",
    2004: "CUDNN_STATUS_BAD_PARAM_NOT_FINALIZED",
    2005: "CUDNN_STATUS_BAD_PARAM_OUT_OF_BOUND",
    2006: "CUDNN_STATUS_BAD_PARAM_SIZE_INSUFFICIENT",
    2007: "CUDNN_STATUS_BAD_PARAM_STREAM_MISMATCH",
    2008: "CUDNN_STATUS_BAD_PARAM_SHAPE_MISMATCH",
    2009: "CUDNN_STATUS_BAD_PARAM_DUPLICATED_ENTRIES",
    2010: "CUDNN_STATUS_BAD_PARAM_ATTRIBUTE_TYPE",
    2011: "CUDNN_STATUS_BAD_PARAM_CUDA_GRAPH_MISMATCH",
    2012: "CUDNN_STATUS_BAD_PARAM_DESCRIPTOR_TYPE",
    3000: "CUDNN_STATUS_NOT_SUPPORTED",
    3001: "CUDNN_STATUS_NOT_SUPPORTED_GRAPH_PATTERN",
    3002: "CUDNN_STATUS_NOT_SUPPORTED_SHAPE",
    3003: "CUDNN_STATUS_NOT_SUPPORTED_DATA_TYPE",
    3004: "CUDNN_STATUS_NOT_SUPPORTED_LAYOUT",
    3005: "CUDNN_STATUS_NOT_SUPPORTED_INCOMPATIBLE_CUDA_DRIVER",
    3006: "CUDNN_STATUS_NOT_SUPPORTED_INCOMPATIBLE_CUDART",
    3007: "CUDNN_STATUS_NOT_SUPPORTED_ARCH_MISMATCH",
    3008: "CUDNN_STATUS_NOT_SUPPORTED_RUNTIME_PREREQUISITE_MISSING",
    3009: "CUDNN_STATUS_NOT_SUPPORTED_SUBLIBRARY_UNAVAILABLE",
    3010: "CUDNN_STATUS_NOT_SUPPORTED_SHARED_MEMORY_INSUFFICIENT",
    3011: "CUDNN_STATUS_NOT_SUPPORTED_PADDING",
    3012: "CUDNN_STATUS_NOT_SUPPORTED_BAD_LAUNCH_PARAM",
    3013: "CUDNN_STATUS_NOT_SUPPORTED_CUDA_GRAPH_NATIVE_API",
    3014: "CUDNN_STATUS_NOT_SUPPORTED_INVALID_DYNAMIC_SHAPE",
    4000: "CUDNN_STATUS_INTERNAL_ERROR",
    4001: "CUDNN_STATUS_INTERNAL_ERROR_COMPILATION_FAILED",
    4002: "CUDNN_STATUS_INTERNAL_ERROR_UNEXPECTED_VALUE",
    4003: "CUDNN_STATUS_INTERNAL_ERROR_HOST_ALLOCATION_FAILED",
    4004: "CUDNN_STATUS_INTERNAL_ERROR_DEVICE_ALLOCATION_FAILED",
    4005: "CUDNN_STATUS_INTERNAL_ERROR_BAD_LAUNCH_PARAM",
    4006: "CUDNN_STATUS_INTERNAL_ERROR_TEXTURE_CREATION_FAILED",
    5000: "CUDNN_STATUS_EXECUTION_FAILED",
    5001: "CUDNN_STATUS_EXECUTION_FAILED_CUDA_DRIVER",
    5002: "CUDNN_STATUS_EXECUTION_FAILED_CUBLAS",
    5003: "CUDNN_STATUS_EXECUTION_FAILED_CUDART",
    5004: "CUDNN_STATUS_EXECUTION_FAILED_CURAND",
}

# cuDNN 8 (cudnn_ops_infer.h)
_STATUS_8 = {
    0: "CUDNN_STATUS_SUCCESS",
    1: "CUDNN_STATUS_NOT_INITIALIZED",
    2: "CUDNN_STATUS_ALLOC_FAILED",
    3: "CUDNN_STATUS_BAD_PARAM",
    4: "CUDNN_STATUS_INTERNAL_ERROR",
    5: "CUDNN_STATUS_INVALID_VALUE",
    6: "CUDNN_STATUS_ARCH_MISMATCH",
    7: "CUDNN_STATUS_MAPPING_ERROR",
    8: "CUDNN_STATUS_EXECUTION_FAILED",
    9: "CUDNN_STATUS_NOT_SUPPORTED",
    10: "CUDNN_STATUS_LICENSE_ERROR",
    11: "CUDNN_STATUS_RUNTIME_PREREQUISITE_MISSING",
    12: "CUDNN_STATUS_RUNTIME_IN_PROGRESS",
    13: "CUDNN_STATUS_RUNTIME_FP_OVERFLOW",
    14: "CUDNN_STATUS_VERSION_MISMATCH",
}


def status_name(code: int, major: int = 9) -> str:
    """The enum name of a cuDNN status code for a library of major version `major`."""
    table = _STATUS_9 if major >= 9 else _STATUS_8
    return table.get(int(code), f"CUDNN_STATUS_{int(code)}")


class CudnnBindError(RuntimeError):
    """Base class of every error cudnn_bind raises about the GPU libraries.

    A RuntimeError.  Bad arguments raise TypeError or ValueError instead
    (`UnsupportedError` among them).
    """


class CudnnUnavailableError(CudnnBindError):
    """No usable cuDNN / CUDA runtime / driver / GPU (the reason is the message).

    Raised by every call that needs the library when none loads (and by
    `cudnn_bind.load` when the one named does not); `cudnn_bind.is_available`
    and `cudnn_bind.unavailable_reason` report the same without raising.
    """


class CudnnError(CudnnBindError):
    """A cuDNN call returned a status other than CUDNN_STATUS_SUCCESS.

    The message reads ``"<function> failed: <name> (<status>): <message>"``,
    followed by ``" -- <detail>"`` when there is a detail.

    Parameters
    ----------
    function : str
        The cuDNN function that failed.
    status : int
        The ``cudnnStatus_t`` it returned.
    name : str
        The status's enum name (``CUDNN_STATUS_BAD_PARAM``, ...).
    message : str
        The status's text (cudnnGetErrorString).
    detail : str, optional
        The detail of the failure (cudnnGetLastErrorString, cuDNN 9; '' in
        8, the default).

    Attributes
    ----------
    function : str
        The cuDNN function that failed.
    status : int
        The status code.
    name : str
        The status's enum name.
    message : str
        cudnnGetErrorString's text.
    detail : str
        cudnnGetLastErrorString's message (cuDNN 9; '' in 8).
    """

    def __init__(self, function: str, status: int, name: str, message: str,
                 detail: str = "") -> None:
        self.function = function
        self.status = int(status)
        self.name = name
        self.message = message
        self.detail = detail
        text = f"{function} failed: {name} ({self.status}): {message}"
        if detail:
            text += f" -- {detail}"
        super().__init__(text)


class CudaError(CudnnBindError):
    """A CUDA runtime call returned an error (`code`, `name`, `message`).

    The message reads ``"<function> failed: <name> (<code>): <message>"``.

    Parameters
    ----------
    function : str
        The CUDA runtime function that failed.
    code : int
        The ``cudaError_t`` it returned.
    name : str
        The error's name (cudaGetErrorName: ``cudaErrorNoDevice``, ...).
    message : str
        The error's text (cudaGetErrorString).

    Attributes
    ----------
    function : str
        The CUDA runtime function that failed.
    code : int
        The error code.
    name : str
        The error's name.
    message : str
        cudaGetErrorString's text.
    """

    def __init__(self, function: str, code: int, name: str, message: str) -> None:
        self.function = function
        self.code = int(code)
        self.name = name
        self.message = message
        super().__init__(f"{function} failed: {name} ({self.code}): {message}")


class UnsupportedError(ValueError):
    """cuDNN has no kernel for this combination of layout, dtype, mode and fused op.

    A ValueError, raised before any cuDNN call by the rules of
    `cudnn_bind.rules`; `cudnn_bind.can_use_cudnn` reports the same words.

    Parameters
    ----------
    rule : str
        The rule's name (``"fused_activation"``).
    message : str
        What the call would need.

    Attributes
    ----------
    rule : str
        The rule's name.
    """

    def __init__(self, rule: str, message: str) -> None:
        self.rule = rule
        super().__init__(message)
