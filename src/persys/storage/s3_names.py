"""S3 bucket naming rules: they live in the model (persys.model.s3_names), which `kind: Bucket`
checks too; re-exported here for the storage layer."""

from persys.model.s3_names import bucket_name_problem

__all__ = ["bucket_name_problem"]
