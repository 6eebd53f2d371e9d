#!/bin/bash
# Llama 3 70B pretraining on 8 nodes x 8 H100 with Megatron-LM (core_r0.x), as our team launches it.
# Run on every node: NODE_RANK=<i> MASTER_ADDR=<node0> bash megatron_args_llama3_70b.sh

export CUDA_DEVICE_MAX_CONNECTIONS=1

GPUS_PER_NODE=8
NNODES=${NNODES:-8}
NODE_RANK=${NODE_RANK:-0}
MASTER_ADDR=${MASTER_ADDR:-localhost}
MASTER_PORT=6000

DISTRIBUTED_ARGS=(
    --nproc_per_node $GPUS_PER_NODE
    --nnodes $NNODES
    --node_rank $NODE_RANK
    --master_addr $MASTER_ADDR
    --master_port $MASTER_PORT
)

MODEL_ARGS="--num-layers 80 --hidden-size 8192 --ffn-hidden-size 28672 \
    --num-attention-heads 64 --group-query-attention --num-query-groups 8 \
    --seq-length 8192 --max-position-embeddings 8192 \
    --swiglu --normalization RMSNorm --position-embedding-type rope --rotary-base 500000 \
    --untie-embeddings-and-output-weights --disable-bias-linear"

TRAINING_ARGS=(
    --micro-batch-size 1
    --global-batch-size 512
    --train-iters 250000
    --lr 1.5e-4 --min-lr 1.5e-5 --lr-decay-style cosine --lr-warmup-iters 2000
    --weight-decay 0.1 --clip-grad 1.0
    --bf16
    --recompute-activations
)

PARALLEL_ARGS=(
    --tensor-model-parallel-size 8
    --pipeline-model-parallel-size 4
    --num-layers-per-virtual-pipeline-stage 5
    --sequence-parallel
    --use-distributed-optimizer
    --overlap-grad-reduce
    --overlap-param-gather
)

DATA_ARGS=(
    --data-path /data/llama3/tokens_text_document
    --tokenizer-type HuggingFaceTokenizer
    --tokenizer-model meta-llama/Meta-Llama-3-70B
    --split 99,1,0
)

torchrun ${DISTRIBUTED_ARGS[@]} pretrain_gpt.py \
    $MODEL_ARGS \
    "${TRAINING_ARGS[@]}" \
    "${PARALLEL_ARGS[@]}" \
    "${DATA_ARGS[@]}" \
    --transformer-impl transformer_engine \
    --log-interval 10 \
    --save /checkpoints/llama3-70b --load /checkpoints/llama3-70b --save-interval 1000
