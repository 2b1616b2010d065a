#!/bin/bash
# One Vidur peer run (README.md beside this file). Usage, from a Vidur checkout with the logging patch:
#   VIDUR_PY=/path/to/vidur-venv/bin/python OUT_ROOT=/path/to/runs run_vidur.sh QPS NUM_REQUESTS NAME
# Lengths: MIN_TOKENS / MAX_TOKENS / PD_RATIO (the saved runs: 256 / 1536 / 4).
set -e
OUT=${OUT_ROOT:?}/$3
rm -rf "$OUT"; mkdir -p "$OUT"
export VIDUR_BATCH_LOG=$OUT/batches.jsonl
"${VIDUR_PY:?}" -m vidur.main \
  --replica_config_device a100 \
  --replica_config_model_name meta-llama/Llama-2-7b-hf \
  --replica_config_tensor_parallel_size 1 \
  --replica_config_num_pipeline_stages 1 \
  --cluster_config_num_replicas 1 \
  --replica_scheduler_config_type vllm \
  --request_generator_config_type synthetic \
  --synthetic_request_generator_config_num_requests "$2" \
  --length_generator_config_type uniform \
  --uniform_request_length_generator_config_min_tokens "${MIN_TOKENS:-256}" \
  --uniform_request_length_generator_config_max_tokens "${MAX_TOKENS:-1536}" \
  --uniform_request_length_generator_config_prefill_to_decode_ratio "${PD_RATIO:-4}" \
  --interval_generator_config_type poisson \
  --poisson_request_interval_generator_config_qps "$1" \
  --execution_time_predictor_config_type random_forrest \
  --random_forrest_execution_time_predictor_config_num_estimators 250 \
  --random_forrest_execution_time_predictor_config_max_depth 32 \
  --random_forrest_execution_time_predictor_config_min_samples_split 2 \
  --random_forrest_execution_time_predictor_config_k_fold_cv_splits 2 \
  --random_forrest_execution_time_predictor_config_num_training_job_threads 1 \
  --metrics_config_cache_dir "$OUT_ROOT/cache" \
  --metrics_config_output_dir "$OUT" \
  --no-metrics_config_store_plots \
  --no-metrics_config_enable_chrome_trace \
  > "$OUT/stdout.log" 2>&1
