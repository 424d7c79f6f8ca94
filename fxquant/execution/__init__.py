"""From simulation to execution: a trained transformed model on integer kernels.

- :func:`convert` turns a model returned by :func:`fxquant.transform` (trained) into a
  :class:`ConvertedModel` whose values between quantization points are integer codes with
  their scales, whose products multiply ``int8`` codes into ``int32`` and whose
  aggregations sum codes into ``int32``; :attr:`ConvertedModel.report` says what runs
  where.
"""

from fxquant.execution.check import Comparison, PointComparison, compare
from fxquant.execution.conversion import ConversionError, convert
from fxquant.execution.export import export_onnx, onnx_inputs
from fxquant.execution.kernels import QTensor
from fxquant.execution.layers import Placement
from fxquant.execution.measure import BitOps, Storage, StorageRow, bit_operations, storage
from fxquant.execution.model import ConversionReport, ConvertedModel
from fxquant.execution.persist import load, save

__all__ = [
           "BitOps",
           "Comparison",
           "ConversionError",
           "ConversionReport",
           "ConvertedModel",
           "Placement",
           "PointComparison",
           "QTensor",
           "Storage",
           "StorageRow",
           "bit_operations",
           "compare",
           "convert",
           "export_onnx",
           "load",
           "onnx_inputs",
           "save",
           "storage",
]
