"""The peers a user would pick instead, timed as benchmarks/train_step.py and
inference.py time this project: timm (PyTorch) eager and `torch.compile`d.

    python benchmarks/peers.py [--models vit_base_patch16_224,resnetv2_50x1_bit] [--batch 256]

A CUDA GPU, torch and timm are needed (neither is a dependency of this
project); on a CPU, benchmarks/peers_cpu.py times timm beside this project. Train step: bfloat16 autocast, cross-entropy, fused AdamW; inference:
bfloat16 autocast under `no_grad`; random images, channels-last, the median of
`--repeats` timed calls after warm-up.
"""
import argparse
import statistics
import time

import timm
import torch
import torch.nn.functional as F


def median_seconds(fn, repeats: int, warmup: int = 3) -> float:
  for _ in range(warmup):
    fn()
  torch.cuda.synchronize()
  times = []
  for _ in range(repeats):
    start = time.perf_counter()
    fn()
    torch.cuda.synchronize()
    times.append(time.perf_counter() - start)
  return statistics.median(times)


def main():
  parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
  parser.add_argument('--models', default='vit_base_patch16_224,resnetv2_50x1_bit')
  parser.add_argument('--batch', type=int, default=256)
  parser.add_argument('--image-size', type=int, default=224)
  parser.add_argument('--repeats', type=int, default=10)
  args = parser.parse_args()
  torch.backends.cuda.matmul.allow_tf32 = True
  torch.backends.cudnn.allow_tf32 = True
  print(f'{torch.cuda.get_device_name()}, torch {torch.__version__}, timm {timm.__version__}, '
        f'batch {args.batch}, {args.image_size} px, bfloat16 autocast')
  print(f'{"model":<24}{"mode":>10}{"train img/s":>13}{"infer img/s":>13}')
  for name in args.models.split(','):
    for mode in ('eager', 'compiled'):
      model = timm.create_model(name, num_classes=1000).cuda().to(
          memory_format=torch.channels_last)
      run = torch.compile(model) if mode == 'compiled' else model
      optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3, weight_decay=1e-4, fused=True)
      images = (torch.rand(args.batch, 3, args.image_size, args.image_size, device='cuda') * 2
                - 1).to(memory_format=torch.channels_last)
      labels = torch.randint(0, 1000, (args.batch,), device='cuda')

      def step():
        with torch.autocast('cuda', dtype=torch.bfloat16):
          loss = F.cross_entropy(run(images), labels)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

      def infer():
        with torch.no_grad(), torch.autocast('cuda', dtype=torch.bfloat16):
          run(images)

      model.train()
      train = args.batch / median_seconds(step, args.repeats)
      model.eval()
      inference = args.batch / median_seconds(infer, args.repeats)
      print(f'{name:<24}{mode:>10}{train:13.1f}{inference:13.1f}', flush=True)


if __name__ == '__main__':
  main()
