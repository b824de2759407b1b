// Modal dialogs (forms, confirmations, the token prompt) and notices.
// Dialogs live outside the page's main area, so the 2 s refresh of the
// data never wipes what someone is typing.

import { h, replace } from './dom.js';

/**
 * A form in a modal. fields: [{name, label, type, value, options, hint,
 * required}]. onSubmit(values) runs the action; its error is shown in the
 * dialog, which stays open; success closes it.
 */
export function formDialog({ id, title, message, fields, submit, danger, onSubmit }) {
  const error = h('p', { class: 'dialog-error', role: 'alert', hidden: true });
  const inputs = fields.map((field) => {
    const input =
      field.type === 'select'
        ? h('select', { name: field.name, required: field.required },
            field.options.map((option) =>
              h('option', { value: option.value, selected: option.value === field.value }, option.label)))
        : field.type === 'checkbox'
        ? h('input', { name: field.name, type: 'checkbox', checked: Boolean(field.value) })
        : h('input', {
            name: field.name,
            type: field.type ?? 'text',
            value: field.value ?? '',
            placeholder: field.placeholder,
            required: field.required,
            autocomplete: 'off',
            spellcheck: 'false',
          });
    if (field.type === 'checkbox') {
      return h('label', { class: 'checkbox' }, input, h('span', {}, field.label), field.hint ? h('small', {}, field.hint) : null);
    }
    return h('label', {}, h('span', {}, field.label), input, field.hint ? h('small', {}, field.hint) : null);
  });
  const submitButton = h('button', { type: 'submit', class: danger ? 'danger' : 'primary' }, submit);
  const cancel = h('button', { type: 'button', class: 'secondary', value: 'cancel' }, 'Cancel');
  const form = h('form', { method: 'dialog', novalidate: true },
    h('h2', {}, title),
    message ? h('p', { class: danger ? 'warning' : '' }, message) : null,
    inputs,
    error,
    h('div', { class: 'dialog-buttons' }, cancel, submitButton));
  const dialog = h('dialog', { id, class: danger ? 'dangerous' : '' }, form);
  cancel.addEventListener('click', () => dialog.close());
  dialog.addEventListener('close', () => dialog.remove());
  form.addEventListener('submit', async (event) => {
    event.preventDefault();
    const values = Object.fromEntries(new FormData(form).entries());
    submitButton.disabled = true;
    error.hidden = true;
    try {
      await onSubmit(values);
      dialog.close();
    } catch (failure) {
      error.textContent = failure.message;
      error.hidden = false;
    } finally {
      submitButton.disabled = false;
    }
  });
  document.body.append(dialog);
  dialog.showModal();
  return dialog;
}

/** A confirmation of something that cannot be undone. */
export function confirmDialog({ id, title, message, confirm, onConfirm }) {
  return formDialog({ id, title, message, fields: [], submit: confirm, danger: true, onSubmit: onConfirm });
}

/**
 * A confirmation of something that loses data or a member: nothing is
 * sent until the thing's name is typed, exactly (a wrong name is refused
 * in the dialog). extraFields come before the name.
 */
export function typedConfirmDialog({ id, title, message, name, what, confirm, extraFields = [], onConfirm }) {
  return formDialog({
    id, title, message, submit: confirm, danger: true,
    fields: [...extraFields, { name: 'typed', label: `Type the ${what}'s name, ${name}, to confirm`, required: true }],
    onSubmit: async (values) => {
      const typed = (values.typed ?? '').trim();
      if (typed !== name) {
        throw new Error(typed
          ? `"${typed}" is not the ${what}'s name: type ${name} to confirm, or cancel`
          : `type the ${what}'s name, ${name}, to confirm, or cancel`);
      }
      await onConfirm(values);
    },
  });
}

/** A short notice in the corner: what an action did, or why it failed. */
export function notify(text, kind = 'ok') {
  const area = document.getElementById('notices');
  const notice = h('div', { class: `notice notice-${kind}`, role: 'status' }, text);
  area.append(notice);
  setTimeout(() => notice.remove(), kind === 'ok' ? 5000 : 12000);
}

/**
 * The token prompt: shown when the node answers 401/403. `reason` is the
 * node's message; `refused` says a token was sent and was wrong.
 */
export function tokenDialog({ reason, refused, onToken }) {
  let dialog = document.getElementById('token-dialog');
  if (!dialog) {
    const input = h('input', {
      name: 'token', type: 'password', required: true, autocomplete: 'off',
      placeholder: 'trmadm-…', 'aria-label': 'admin token',
    });
    const form = h('form', { method: 'dialog' },
      h('h2', {}, 'This node needs the admin token'),
      h('p', { class: 'token-reason' }),
      h('p', {}, 'Clients that are not on the node\'s own machine (loopback) must show the cluster\'s admin token: the content of ',
        h('code', {}, 'DATA/admin.token'), ' on any node of the cluster. It is kept in this browser tab only (sessionStorage) and sent to this node with every request.'),
      h('label', {}, h('span', {}, 'Admin token'), input),
      h('div', { class: 'dialog-buttons' }, h('button', { type: 'submit', class: 'primary' }, 'Use this token')));
    dialog = h('dialog', { id: 'token-dialog' }, form);
    // Without a token there is nothing to show: the prompt stays until one is given.
    dialog.addEventListener('cancel', (event) => event.preventDefault());
    form.addEventListener('submit', (event) => {
      event.preventDefault();
      const value = input.value.trim();
      if (!value) return;
      input.value = '';
      dialog.close();
      onToken(value);
    });
    document.body.append(dialog);
  }
  replace(
    dialog.querySelector('.token-reason'),
    refused ? `The token was refused: ${reason}` : `The node says: ${reason}`,
  );
  dialog.querySelector('.token-reason').classList.toggle('warning', Boolean(refused));
  if (!dialog.open) dialog.showModal();
  dialog.querySelector('input').focus();
}
