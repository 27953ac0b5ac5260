"""The release records of the recorded converged host (its ReleaseRecords answers): the current release
and the one before, for the rollback plans (tests/plans/test_lifecycle_plans.py) and the copies' (tests/unit/test_instances.py)."""


CURRENT = {"links": {"/opt/qwen27b/current": "/opt/qwen27b/releases/bc7b88da5403",
                     "/var/lib/qwen27b/models/current": "/var/lib/qwen27b/models/nvidia--Qwen3.8-27B-NVFP4@main",
                     "/var/lib/qwen27b/models/draft": "/var/lib/qwen27b/models/incoai--Qwen3.8-27B-DFlash2@main"},
           "model_ref": "nvidia/Qwen3.8-27B-NVFP4@main", "served_name": "qwen3.8-27b", "speculative": True,
           "start_timeout_s": 1800, "url": "http://10.0.0.5:8000"}
PREVIOUS = {**CURRENT, "model_ref": "nvidia/Qwen3.8-27B-NVFP4@abc1234",
            "links": {**CURRENT["links"], "/var/lib/qwen27b/models/current": "/var/lib/qwen27b/models/nvidia--Qwen3.8-27B-NVFP4@abc1234"}}
