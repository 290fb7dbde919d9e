"""Text classification fine-tuning in the style of Hugging Face transformers' run_glue.py, seeded correctly:
set_seed before the model (and its new classification head) is created, full determinism requested."""

import logging
import random
import sys
from dataclasses import dataclass, field

import datasets
import evaluate
import numpy as np
import transformers
from transformers import (
    AutoConfig,
    AutoModelForSequenceClassification,
    AutoTokenizer,
    DataCollatorWithPadding,
    HfArgumentParser,
    Trainer,
    TrainingArguments,
    set_seed,
)

logger = logging.getLogger(__name__)


@dataclass
class DataTrainingArguments:
    task_name: str = field(default="mrpc")
    max_seq_length: int = field(default=128)
    max_train_samples: int | None = field(default=None)


@dataclass
class ModelArguments:
    model_name_or_path: str = field(default="bert-base-cased")
    cache_dir: str | None = field(default=None)


def main():
    parser = HfArgumentParser((ModelArguments, DataTrainingArguments, TrainingArguments))
    model_args, data_args, training_args = parser.parse_args_into_dataclasses()
    logging.basicConfig(handlers=[logging.StreamHandler(sys.stdout)])
    transformers.utils.logging.set_verbosity_info()

    # Seed before anything is drawn: the model's classification head is initialised randomly.
    set_seed(training_args.seed)

    raw_datasets = datasets.load_dataset("nyu-mll/glue", data_args.task_name, cache_dir=model_args.cache_dir)
    label_list = sorted(set(raw_datasets["train"].unique("label")))
    num_labels = len(label_list)
    label_to_id = {label: i for i, label in enumerate(label_list)}

    config = AutoConfig.from_pretrained(model_args.model_name_or_path, num_labels=num_labels)
    tokenizer = AutoTokenizer.from_pretrained(model_args.model_name_or_path)
    model = AutoModelForSequenceClassification.from_pretrained(model_args.model_name_or_path, config=config)
    model.config.label2id = label_to_id
    model.config.id2label = {i: label for label, i in label_to_id.items()}

    def preprocess_function(examples):
        result = tokenizer(examples["sentence1"], examples["sentence2"], truncation=True,
                           max_length=data_args.max_seq_length)
        result["label"] = [label_to_id[label] for label in examples["label"]]
        return result

    raw_datasets = raw_datasets.map(preprocess_function, batched=True)
    train_dataset = raw_datasets["train"]
    if data_args.max_train_samples is not None:
        train_dataset = train_dataset.select(range(data_args.max_train_samples))
    eval_dataset = raw_datasets["validation"]

    for index in random.sample(range(len(train_dataset)), 3):
        logger.info(f"Sample {index} of the training set: {train_dataset[index]}.")

    metric = evaluate.load("glue", data_args.task_name)

    def compute_metrics(p):
        preds = np.argmax(p.predictions, axis=1)
        return metric.compute(predictions=preds, references=p.label_ids)

    trainer = Trainer(
        model=model,
        args=training_args,
        train_dataset=train_dataset,
        eval_dataset=eval_dataset,
        compute_metrics=compute_metrics,
        processing_class=tokenizer,
        data_collator=DataCollatorWithPadding(tokenizer),
    )
    train_result = trainer.train(resume_from_checkpoint=training_args.resume_from_checkpoint)
    trainer.save_model()
    trainer.log_metrics("train", train_result.metrics)
    trainer.save_state()
    trainer.evaluate(eval_dataset=eval_dataset)


if __name__ == "__main__":
    main()
